#!/usr/bin/env python3
"""Checks the size rule of the code base (the Makefile header and
docs/architecture.md §9): every product C file (git ls-files '*.c' outside tests/) has at most 1,200
lines and every function in it at most 120.

A function's size is counted from the line of its name (where its parameter
list opens) to its closing brace, comments and blank lines included; this
is stricter than clang-tidy's readability-function-size (body braces only),
so a tree that passes here passes that check too. Functions are found the
way the repository formats them (.clang-format puts a function's opening
brace alone on its line); comments, strings and preprocessor lines are
skipped.

Exceptions (files and functions still over the limit while they are being
split) are listed in scripts/size-exceptions.txt, one per line:

    <path> <max lines>                 a file
    <path> <function> <max lines>      a function

An exception allows exactly up to its max, so a listed file or function
cannot grow in the meantime; an entry that is no longer needed is reported
(not an error) so that it gets removed.

Usage: scripts/check-sizes.py [--exceptions FILE] [FILE...]
Exit status: 0 clean, 1 something over the limit, 2 usage error.
"""
import argparse
import os
import re
import subprocess
import sys

FILE_MAX = 1200
FUNC_MAX = 120
DEFAULT_EXCEPTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  'size-exceptions.txt')


def product_files(root):
    """The product .c files: tracked by git, outside tests/."""
    try:
        out = subprocess.run(['git', 'ls-files', '*.c'], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        files = out.split()
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in ('.git', 'build')]
            for n in names:
                if n.endswith('.c'):
                    files.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(f for f in files if not f.startswith('tests/'))


def code_lines(text):
    """The file's lines with comments, string and character literals and
    preprocessor lines blanked, so braces and parentheses in them do not
    count."""
    out, cur = [], []
    state = 'code'  # code | block | str | chr
    lines = text.split('\n')
    in_pp = False
    for line in lines:
        if state == 'code' and (in_pp or line.lstrip().startswith('#')):
            in_pp = line.rstrip().endswith('\\')
            out.append('')
            continue
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if state == 'block':
                if line.startswith('*/', i):
                    state = 'code'
                    i += 2
                    continue
                i += 1
                continue
            if state in ('str', 'chr'):
                if c == '\\':
                    i += 2
                    continue
                if (c == '"' and state == 'str') or \
                        (c == "'" and state == 'chr'):
                    state = 'code'
                i += 1
                continue
            if line.startswith('//', i):
                break
            if line.startswith('/*', i):
                state = 'block'
                i += 2
                continue
            if c == '"':
                state = 'str'
            elif c == "'":
                state = 'chr'
            else:
                cur.append(c)
            i += 1
        if state in ('str', 'chr'):
            state = 'code'  # an unterminated literal ends with its line
        out.append(''.join(cur))
        cur = []
    return out


def functions(text):
    """(name, first line, number of lines) of every function definition."""
    code = code_lines(text)
    found = []
    depth = 0
    start = None
    name = None
    for i, line in enumerate(code):
        if depth == 0 and line.startswith('{'):
            start, name = signature_start(code, i)
        depth += line.count('{') - line.count('}')
        if depth <= 0:
            depth = 0
            if start is not None and '}' in line:
                found.append((name, start + 1, i - start + 1))
                start = None
    return found


def signature_start(code, brace):
    """The line where the parameter list before the brace on line `brace`
    opens, and the name before it; (None, None) when the brace does not
    follow a parameter list (not a function)."""
    depth = 0
    seen = False
    for j in range(brace - 1, max(brace - 40, -1), -1):
        line = code[j]
        for k in range(len(line) - 1, -1, -1):
            c = line[k]
            if c == ')':
                depth += 1
                seen = True
            elif c == '(':
                depth -= 1
                if seen and depth == 0:
                    m = re.search(r'([A-Za-z_]\w*)\s*$', line[:k])
                    return j, m.group(1) if m else '?'
            elif not seen and not c.isspace():
                return None, None
    return None, None


def load_exceptions(path):
    """{(path, function or None): max lines}."""
    allowed = {}
    if path is None or not os.path.exists(path):
        return allowed
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.split('#', 1)[0].split()
            if not line:
                continue
            if len(line) not in (2, 3) or not line[-1].isdigit():
                print(f'{path}:{n}: expected "<path> [<function>] '
                      f'<max lines>", got: {raw.strip()}', file=sys.stderr)
                sys.exit(2)
            func = line[1] if len(line) == 3 else None
            allowed[(line[0], func)] = int(line[-1])
    return allowed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--exceptions', default=DEFAULT_EXCEPTIONS,
                    help='allow-list (default: scripts/size-exceptions.txt)')
    ap.add_argument('files', nargs='*',
                    help='files to check (default: every product .c file)')
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = args.files or product_files(root)
    allowed = load_exceptions(args.exceptions)
    used = set()
    errors = []
    for path in files:
        full = path if os.path.isabs(path) else os.path.join(root, path)
        with open(full, errors='replace') as f:
            text = f.read()
        nlines = text.count('\n')
        if nlines > FILE_MAX:
            cap = allowed.get((path, None))
            used.add((path, None))
            if cap is None or nlines > cap:
                more = f' (allowed {cap} until split)' if cap else ''
                errors.append(f'{path}:1: file has {nlines} lines, more than '
                              f'{FILE_MAX}{more}: split it along a seam')
        for name, line, size in functions(text):
            if size <= FUNC_MAX:
                continue
            cap = allowed.get((path, name))
            used.add((path, name))
            if cap is None or size > cap:
                more = f' (allowed {cap} until split)' if cap else ''
                errors.append(f'{path}:{line}: function {name} has {size} '
                              f'lines, more than {FUNC_MAX}{more}')
    checked = set(files)
    listed = os.path.abspath(args.exceptions)
    if listed.startswith(root + os.sep):
        listed = os.path.relpath(listed, root)
    stale = [k for k in allowed if k not in used and k[0] in checked]
    for key in sorted(stale, key=lambda k: (k[0], k[1] or '')):
        what = key[0] if key[1] is None else f'{key[0]} {key[1]}'
        print(f'check-sizes: note: exception "{what}" is no longer needed; '
              f'remove it from {listed}',
              file=sys.stderr)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f'check-sizes: {len(errors)} over the limit (files <= '
              f'{FILE_MAX} lines, functions <= {FUNC_MAX})', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
