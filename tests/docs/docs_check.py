#!/usr/bin/env python3
"""Checks README.md and docs/*.md against the repository and the built programs.

    python3 tests/docs/docs_check.py [--repo DIR] [--bin DIR] [--require PROG]... [FILE.md]...

Each problem is printed as file:line: what; the exit status is 1 when there is
one, else 0. What is checked:

  (a) repository paths: a word whose first component is a top-level folder of
      the repository (apps/cls.toml, plugins/ucx/README.md, fleet/src/x.cc,
      `tests/core/<area>_test.cc`, apps/*.toml) must exist in the working tree
      (<...> and * are wildcards, {a,b} alternatives); one that exists only
      under a renamed folder (torch/ -> fleet/) is named with its new path.
      Relative Markdown links ([x](ps.md), [x](../plugins/ps_grpc/README.md))
      must name a file, and a #fragment a heading of that file.
  (b) machine paths: no absolute path under /work, /root or /home (one
      machine's folders); write a path in the repository, under build/, or
      $HOME / ~ instead.
  (c) options: in code blocks and `inline code`, a command that runs dtrain,
      dtrain-bench <sub>, dtrain-conformance or dtrain-cls/ocr/seg/ctr (bare or
      as a path: build/bin/dtrain, /opt/dtrain/bin/dtrain) may give only
      --options that the program's --help lists (the help of `PROG SUB --help`
      for a subcommand: dtrain check, dtrain-ctr predict, dtrain-bench training
      ctr). Options after a lone `--` belong to the started program and are
      not checked. The programs are run from --bin (default: build/bin); one
      that is not there is skipped with a note, unless named by --require.

Pure standard library; it imports nothing of the repository (from the
repository root, `import torch` would not be PyTorch).
"""

import argparse
import concurrent.futures
import glob
import itertools
import os
import re
import subprocess
import sys
import threading

# Where a doc deliberately shows something wrong (an error example): entries
# ("docs/x.md", "text on the line", "why"); a problem on a matching line is
# not reported, and an entry that matches nothing is. Fix a doc that is wrong
# instead of adding one here. None is needed now.
EXCEPTIONS = []

# Folders renamed at the top level: a path under the old name is stale.
RENAMED = {"torch": "fleet"}

# Machine paths: one machine's folders, never the reader's.
MACHINE_PATH = re.compile(r"(?<![\w.~$/-])(/(?:work|root|home)(?:/[\w.+@%-]*)*)")

PROGRAMS = ("dtrain", "dtrain-bench", "dtrain-conformance", "dtrain-cls", "dtrain-ocr", "dtrain-seg", "dtrain-ctr")
PROGRAM_TOKEN = re.compile(r"^(?:[\w.~$/{}-]*/)?(" + "|".join(re.escape(p) for p in PROGRAMS) + r")$")
VERBOSE = False
OPTION = re.compile(r"^--([A-Za-z0-9][\w-]*)(?:=.*)?$")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(here)), help="the repository root")
    ap.add_argument("--bin", default=None, help="folder of the built programs (default: REPO/build/bin)")
    ap.add_argument("--require", action="append", default=[], help="a program that must be in --bin (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every command checked")
    ap.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    return ap.parse_args()


class Problems:
    def __init__(self, repo):
        self.repo = repo
        self.items = []
        self.used_exceptions = set()

    def add(self, path, line_no, line_text, what):
        rel = os.path.relpath(path, self.repo)
        for i, (f, text, _why) in enumerate(EXCEPTIONS):
            if f == rel and text in line_text:
                self.used_exceptions.add(i)
                return
        self.items.append((rel, line_no, what))


# ---------------------------------------------------------------- Markdown


def split_markdown(text):
    """Yields (kind, first_line_no, lines): kind "code" for fenced and indented
    code blocks, "prose" for the rest (paragraphs, lists, tables, headings)."""
    lines = text.split("\n")
    i = 0
    prose = []
    prose_start = 1

    def flush():
        nonlocal prose
        if prose:
            yield ("prose", prose_start, prose)
        prose = []

    prev_blank = True
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^\s*(```+|~~~+)", line)
        if fence:
            yield from flush()
            marker = fence.group(1)
            start = i + 1
            i += 1
            body = []
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            yield ("code", start + 1, body)
            i += 1
            prev_blank = False
            prose_start = i + 1
            continue
        if prev_blank and line.startswith("    ") and line.strip() and not re.match(r"^\s*([-*+]|\d+\.)\s", line):
            # An indented code block (after a blank line, not a list item's continuation).
            yield from flush()
            start = i + 1
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            yield ("code", start, body)
            prev_blank = True
            prose_start = i + 1
            continue
        if not prose:
            prose_start = i + 1
        prose.append(line)
        prev_blank = not line.strip()
        i += 1
    yield from flush()


def inline_code_spans(prose_lines, first_line_no):
    """Yields (line_no, code) for each `code` span; a span may cross line
    breaks inside a paragraph but not a blank line."""
    text = "\n".join(prose_lines)
    for m in re.finditer(r"(`+)((?:(?!\n\s*\n).)+?)\1", text, re.S):
        line_no = first_line_no + text.count("\n", 0, m.start())
        yield line_no, m.group(2).replace("\n", " ").strip()


def github_slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings_of(path, cache={}):
    if path not in cache:
        slugs = set()
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        for kind, _n, lines in split_markdown(text):
            if kind != "prose":
                continue
            for line in lines:
                m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    slug = github_slug(m.group(1))
                    base, k = slug, 1
                    while slug in slugs:
                        slug = f"{base}-{k}"
                        k += 1
                    slugs.add(slug)
        cache[path] = slugs
    return cache[path]


# ---------------------------------------------------------------- (a) paths


def top_level_folders(repo):
    try:
        out = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True, timeout=30, check=True)
        names = {p.split("/", 1)[0] for p in out.stdout.splitlines() if "/" in p}
        if names:
            return names
    except (OSError, subprocess.SubprocessError):
        pass
    return {d for d in os.listdir(repo)
            if os.path.isdir(os.path.join(repo, d)) and not d.startswith(("build", "output", "log", "."))}


def expand_braces(s):
    m = re.search(r"\{([^{}]*,[^{}]*)\}", s)
    if not m:
        return [s]
    out = []
    for alt in m.group(1).split(","):
        out.extend(expand_braces(s[: m.start()] + alt + s[m.end():]))
    return out


def path_exists(repo, rel):
    for candidate in expand_braces(rel):
        pattern = re.sub(r"<[^<>/]*>", "*", candidate)
        pattern = pattern.replace("...", "*")
        if any(c in pattern for c in "*?["):
            if glob.glob(os.path.join(repo, pattern)):
                return True
        elif os.path.exists(os.path.join(repo, pattern)):
            return True
    return False


def path_regex(folders):
    names = sorted(set(folders) | set(RENAMED), key=len, reverse=True)
    # Not inside another path, a URL or a word (src/tests/..., https://x/apps/..., dtrain/fleet/ps.h).
    return re.compile(r"(?<![\w./~$@:-])((?:" + "|".join(re.escape(n) for n in names) + r")/[\w./<>*{},+-]*)")


def clean_path(p):
    p = re.sub(r":\d+(-\d+)?$", "", p)  # file:line
    while p and p[-1] in ".,;:)":
        p = p[:-1]
    return p


def tree_parents(text):
    """For the lines of a folder tree in a code block (an indented line under
    a line whose first word is a folder, `sdk/` then `  examples/minimal/`),
    line number -> the folder its paths are relative to."""
    parents = {}
    for kind, first, lines in split_markdown(text):
        if kind != "code":
            continue
        stack = []  # (indent, folder)
        for k, line in enumerate(lines):
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if stack:
                parents[first + k] = stack[-1][1]
            word = line.split()[0]
            if word.endswith("/") and not word.startswith("/"):
                stack.append((indent, (stack[-1][1] if stack else "") + word))
    return parents


def check_paths(path, text, folders, problems):
    rx = path_regex(folders)
    repo = problems.repo
    parents = tree_parents(text)
    for line_no, line in enumerate(text.split("\n"), 1):
        for m in rx.finditer(line):
            p = clean_path(m.group(1))
            top, _, rest = p.partition("/")
            if rest == "s":
                continue  # a rate: 180k examples/s
            if top in RENAMED:
                new = RENAMED[top] + p[len(top):]
                if path_exists(repo, new):
                    problems.add(path, line_no, line, f"'{p}': the folder {top}/ is now {RENAMED[top]}/ ({new})")
                continue  # torch/lib of a PyTorch wheel, <torch/torch.h>: not ours
            if not path_exists(repo, p) and not (line_no in parents and path_exists(repo, parents[line_no] + p)):
                problems.add(path, line_no, line, f"'{p}' does not exist in the repository")
        for m in MACHINE_PATH.finditer(line):
            problems.add(path, line_no, line, f"'{clean_path(m.group(1))}' is a path of one machine "
                                              "(use a repository path, build/..., or $HOME)")
        for m in re.finditer(r"\]\(([^)\s]+)\)", line):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if file_part and not os.path.exists(dest):
                problems.add(path, line_no, line, f"link '{target}': {file_part} does not exist")
            elif frag and dest.endswith(".md") and frag not in headings_of(dest):
                problems.add(path, line_no, line,
                             f"link '{target}': no heading #{frag} in {os.path.relpath(dest, repo)}")


# ---------------------------------------------------------------- (c) options


class Helps:
    """The options of each program (and subcommand), from its --help."""

    def __init__(self, bin_dir, required):
        self.bin_dir = bin_dir
        self.required = set(required)
        self.cache = {}
        self.locks = {}
        self.lock = threading.Lock()
        self.missing_noted = set()

    def _run(self, prog, words):
        key = (prog,) + tuple(words)
        with self.lock:
            key_lock = self.locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self.cache:
                exe = os.path.join(self.bin_dir, prog)
                try:
                    r = subprocess.run([exe, *words, "--help"], capture_output=True, text=True, timeout=30,
                                       stdin=subprocess.DEVNULL)
                    self.cache[key] = (r.stdout + r.stderr) if r.returncode == 0 else None
                except (OSError, subprocess.SubprocessError):
                    self.cache[key] = None
        return self.cache[key]

    def prefetch(self, runs):
        """Reads every --help that the runs need, a few at a time (a libtorch
        program takes most of a second to start)."""
        todo = sorted({(prog, tuple(positionals[:2])) for prog, positionals in runs
                       if self.available(prog) and self.available(executable_of(prog, positionals))})
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda r: self.options_of(r[0], list(r[1])), todo))

    @staticmethod
    def _subcommand_word(prog, words, w):
        if prog == "dtrain-bench" and words == ["training"] and w.endswith("ctr.toml"):
            w = "ctr"  # bench/main.cc: a ctr.toml job is `dtrain-bench training ctr`
        return w if re.match(r"^[a-z][\w-]*$", w) else None

    @staticmethod
    def _usage_names(text, word):
        """Whether the help's Usage line names word: `dtrain check [OPTIONS]`,
        `predict [OPTIONS] job`, `.../dtrain-bench-ctr [OPTIONS]` (a program
        the subcommand execs)."""
        for line in text.splitlines():
            if line.startswith("Usage:"):
                names = set()
                for token in line.split()[1:]:
                    if token.startswith("["):
                        break
                    base = os.path.basename(token)
                    names.add(base)
                    names.update(base.split("-"))
                return word in names
        return False

    def available(self, prog):
        return os.access(os.path.join(self.bin_dir, prog), os.X_OK)

    def options_of(self, prog, positionals):
        """(name shown, set of long options) for prog and the subcommand the
        leading positionals select (up to 2 words, each one whose `--help`
        names it in its Usage line)."""
        text = None
        shown = [prog]
        words = []
        for w in positionals[:2]:
            w = self._subcommand_word(prog, words, w)
            if w is None:
                break
            sub = self._run(prog, words + [w])
            if sub is None or not self._usage_names(sub, w):
                break
            words.append(w)
            shown.append(w)
            text = sub
        if text is None:
            text = self._run(prog, [])
            if text is None:
                return None, None
        opts = set()
        for line in text.splitlines():
            m = re.match(r"^\s+(-[^\s]+(?:\s*,\s*-[^\s]+)*)", line)
            if not m:
                continue
            for name in re.split(r"\s*,\s*", m.group(1)):
                if name.startswith("--"):
                    opts.add(re.sub(r"[=\[].*$", "", name[2:]))
        return " ".join(shown), opts


def shell_words(command):
    """Rough shell words of a one-line command: quotes kept together, a
    trailing # comment dropped."""
    words = []
    for m in re.finditer(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""", command):
        w = m.group(0)
        if w.startswith("#"):
            break
        words.append(w)
    return words


def commands_in(code):
    """Splits a code line into the commands it runs (on ; && || | and $( ))."""
    code = re.sub(r"^\s*\$\s+", "", code)  # a prompt
    for part in re.split(r"\s(?:\|\||&&|\||;)\s|\$\(|`|\)\s", code):
        yield part


def programs_run(code):
    """Yields (program, arguments) for each named program the code line runs,
    its arguments up to a lone `--` (after it, the started program and its
    own arguments, checked as such where it is one of ours)."""
    for command in commands_in(code):
        words = shell_words(command)
        i = 0
        while i < len(words):
            m = PROGRAM_TOKEN.match(words[i].strip("'\""))
            if not m or (i > 0 and words[i - 1] in ("which", "cd", "ldd")):
                i += 1
                continue
            args = []
            i += 1
            while i < len(words) and words[i] != "--":
                a = words[i]
                args.append(a.strip("[]()") if a.startswith(("[", "(")) else a)  # usage: [--count N]
                i += 1
            yield m.group(1), args
            i += 1  # after `--`, the started program: `dtrain -- dtrain-conformance --backend gloo`


def commands_of(text):
    """Yields (line_no, program, arguments) for every run of a named program
    with at least one --option, in code blocks and `inline code`."""
    for kind, first, lines in split_markdown(text):
        if kind == "code":
            j = 0
            while j < len(lines):
                start = j
                joined = lines[j]
                while joined.rstrip().endswith("\\") and j + 1 < len(lines):
                    j += 1
                    joined = joined.rstrip()[:-1] + " " + lines[j].strip()
                for prog, args in programs_run(joined):
                    yield first + start, prog, args
                j += 1
        else:
            for line_no, code in inline_code_spans(lines, first):
                for prog, args in programs_run(code):
                    yield line_no, prog, args


def check_options(path, text, commands, helps, problems):
    all_lines = text.split("\n")
    for line_no, prog, args in commands:
        line_text = all_lines[line_no - 1]
        flags = [a for a in args if OPTION.match(a)]
        if not flags:
            continue
        positionals = leading_positionals(args)
        exe = executable_of(prog, positionals)
        if not helps.available(prog) or not helps.available(exe):
            missing = exe if helps.available(prog) else prog
            if missing in helps.required:
                problems.add(path, line_no, line_text, f"{missing} is not in {helps.bin_dir} (build it)")
            elif missing not in helps.missing_noted:
                helps.missing_noted.add(missing)
                print(f"docs_check: note: {missing} is not built in {helps.bin_dir}; the options of `{prog}"
                      + (" " + positionals[0] if exe != prog else "") + "` are not checked")
            continue
        shown, opts = helps.options_of(prog, positionals)
        if opts is None:
            problems.add(path, line_no, line_text, f"{prog} --help failed")
            continue
        if VERBOSE:
            print(f"{os.path.relpath(path, problems.repo)}:{line_no}: `{shown}` {' '.join(flags)}")
        for f in flags:
            name = OPTION.match(f).group(1)
            if name not in opts:
                problems.add(path, line_no, line_text, f"`{shown}` has no option --{name}")


def executable_of(prog, positionals):
    """The program that parses the options: `dtrain-bench training` execs
    dtrain-bench-training, `training ctr` (or a ctr.toml job) dtrain-bench-ctr
    (bench/main.cc); both are built only with libtorch."""
    if prog == "dtrain-bench" and positionals[:1] == ["training"]:
        ctr = len(positionals) > 1 and (positionals[1] == "ctr" or positionals[1].endswith("ctr.toml"))
        return "dtrain-bench-ctr" if ctr else "dtrain-bench-training"
    return prog


def leading_positionals(args):
    return list(itertools.takewhile(lambda a: not a.startswith("-"), args))


# ---------------------------------------------------------------- main


def main():
    global VERBOSE
    args = parse_args()
    VERBOSE = args.verbose
    repo = os.path.abspath(args.repo)
    bin_dir = os.path.abspath(args.bin or os.path.join(repo, "build", "bin"))
    files = args.files or [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
    files = [os.path.abspath(f) for f in files]
    problems = Problems(repo)
    folders = top_level_folders(repo)
    helps = Helps(bin_dir, args.require)
    texts = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            texts[f] = fh.read()
    commands = {f: [c for c in commands_of(texts[f]) if any(OPTION.match(a) for a in c[2])] for f in files}
    helps.prefetch((prog, leading_positionals(args)) for cs in commands.values() for _n, prog, args in cs)
    for f in files:
        check_paths(f, texts[f], folders, problems)
        check_options(f, texts[f], commands[f], helps, problems)
    for i, (f, text, why) in enumerate(EXCEPTIONS):
        if i not in problems.used_exceptions and os.path.join(repo, f) in files:
            problems.items.append((f, 0, f"exception '{text}' ({why}) matches nothing any more: remove it"))
    for f, n, what in sorted(problems.items):
        print(f"{f}:{n}: {what}")
    checked = ", ".join(sorted(k[0] + "".join(" " + w for w in k[1:]) for k in helps.cache))
    print(f"docs_check: {len(files)} files, {len(problems.items)} problems; programs' --help read: {checked or 'none'}")
    return 1 if problems.items else 0


if __name__ == "__main__":
    sys.exit(main())
