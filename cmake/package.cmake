# The kvdepot .deb (CPack's DEB generator): `make deb` configures the
# `package` preset (release, prefix /usr) and runs cpack on it. The package
# holds what `cmake --install` installs (library, headers, pkg-config file,
# kvdepotd, the kvdepot CLI, the systemd unit, the example configuration)
# plus what a Debian system needs to run the daemon: the sysusers.d and
# tmpfiles.d entries, /etc/kvdepot/kvdepotd.yaml as a conffile and the
# maintainer scripts of deploy/deb/. Its Depends are exactly
# `scripts/install-deps.sh runtime --list`.

# The unit's ExecStart names the installed kvdepotd.
file(READ ${PROJECT_SOURCE_DIR}/deploy/systemd/kvdepotd.service KVD_UNIT)
string(REPLACE "ExecStart=/usr/local/sbin/kvdepotd"
       "ExecStart=${CMAKE_INSTALL_FULL_SBINDIR}/kvdepotd" KVD_UNIT_OUT
       "${KVD_UNIT}")
if(KVD_UNIT_OUT STREQUAL KVD_UNIT
   AND NOT CMAKE_INSTALL_FULL_SBINDIR STREQUAL "/usr/local/sbin")
    message(FATAL_ERROR "deploy/systemd/kvdepotd.service: no ExecStart="
                        "/usr/local/sbin/kvdepotd line to point at "
                        "${CMAKE_INSTALL_FULL_SBINDIR}")
endif()
file(WRITE ${PROJECT_BINARY_DIR}/kvdepotd.service "${KVD_UNIT_OUT}")
install(FILES ${PROJECT_BINARY_DIR}/kvdepotd.service
        DESTINATION lib/systemd/system)
install(FILES deploy/config/kvdepotd.yaml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/kvdepot)

if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    return()
endif()

# Only a /usr install is a system package: the user, its directories and
# the configuration in /etc.
install(FILES deploy/systemd/kvdepot.sysusers
        DESTINATION lib/sysusers.d RENAME kvdepot.conf)
install(FILES deploy/systemd/kvdepot.tmpfiles
        DESTINATION lib/tmpfiles.d RENAME kvdepot.conf)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME copyright)
# /etc/kvdepot/kvdepotd.yaml: the example with the sizes of its production
# node (a 64 GiB arena, 512 GiB on NVMe) brought down to kvdepotd's
# defaults, so that `systemctl enable --now kvdepotd` starts on any
# machine; the administrator raises them.
file(READ ${PROJECT_SOURCE_DIR}/deploy/config/kvdepotd.yaml KVD_CONF)
foreach(pair "arena_size: 64g|arena_size: 8g" "disk_size: 512g|disk_size: 16g")
    string(REPLACE "|" ";" pair "${pair}")
    list(GET pair 0 from)
    list(GET pair 1 to)
    string(FIND "${KVD_CONF}" "  ${from}\n" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "deploy/config/kvdepotd.yaml: no '${from}' line")
    endif()
    string(REPLACE "  ${from}\n" "  ${to}\n" KVD_CONF "${KVD_CONF}")
endforeach()
string(REPLACE
       "# kvdepotd.yaml: an example configuration for kvdepotd on a production node."
       "# /etc/kvdepot/kvdepotd.yaml, from the kvdepot package: the example of\n# /usr/share/kvdepot/kvdepotd.yaml with store.arena_size and store.disk_size\n# at their defaults (8g, 16g); raise them to the node's RAM and NVMe.\n#\n# kvdepotd.yaml: an example configuration for kvdepotd on a production node."
       KVD_CONF "${KVD_CONF}")
file(WRITE ${PROJECT_BINARY_DIR}/etc/kvdepotd.yaml "${KVD_CONF}")
install(FILES ${PROJECT_BINARY_DIR}/etc/kvdepotd.yaml
        DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/kvdepot)

execute_process(
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/install-deps.sh runtime --list
    OUTPUT_VARIABLE KVD_RUNTIME_PKGS OUTPUT_STRIP_TRAILING_WHITESPACE
    COMMAND_ERROR_IS_FATAL ANY)
string(REPLACE "\n" ", " KVD_RUNTIME_PKGS "${KVD_RUNTIME_PKGS}")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvdepot)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "kvdepot developers <kvdepot@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "kvdepot keeps the KV blocks an LLM engine computed and gives them back:
the store daemon kvdepotd (host arena, NVMe tier, cluster through etcd),
the kvdepot control CLI and libkvdepot, which the vLLM and TensorRT-LLM
connectors of the kvdepot Python package load.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${KVD_RUNTIME_PKGS}")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/deb/conffiles
    ${PROJECT_SOURCE_DIR}/deploy/deb/postinst
    ${PROJECT_SOURCE_DIR}/deploy/deb/prerm
    ${PROJECT_SOURCE_DIR}/deploy/deb/postrm)
include(CPack)
