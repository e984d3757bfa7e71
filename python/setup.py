"""The wheel carries libkvdepot.so (staged next to the package by
scripts/build-wheel.sh), so it is a platform wheel: py3-none-<platform>,
the package itself being pure Python over ctypes."""

from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel


class WithLibrary(Distribution):
    def has_ext_modules(self):
        return True  # libkvdepot.so: platform-specific files


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(distclass=WithLibrary, cmdclass={"bdist_wheel": PlatformWheel})
