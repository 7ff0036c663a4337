"""Runs every code block of a Markdown page as written, in order, and fails on the first that fails.

    run_doc_blocks.py <page.md> <source dir> <build dir> [--list] [--ci-script FILE]

What each fenced block is, by its language:
  sh          commands: run by bash -e -o pipefail, from a scratch folder that holds the source tree's
              entries (linked) with build/ the build folder, so that files a command writes land there;
              blocks of a page share that folder, in the page's order
  c           a program (it has main): built against the build's libbackplane and run on 2 ranks of
              CPU mode under bpl-run
  python      a program: run on 2 ranks of CPU mode under bpl-run with the project's Python, with
              build/python and python/ on its path; one that uses the backplane package without
              torch.distributed (which needs a launcher's variables) runs first as one process, as a
              user first tries it
  text, none  output or a picture: not code, not run; a text block marked `<!-- output: why -->` on the
              line above its fence is the expected output of the code block before it (with any marked
              output blocks between them): each of its lines
              must be a line that block printed (stdout or stderr), where "…" or "..." stands for any
              text (what changes from run to run: pids, ports, timings)
Every relative link of the page must name a file that exists and, for a Markdown page, a heading or
an `<a id>` of it. With --ci-script, the page's test command (the line after its "# 2." comment, the
README's) must be the command that script runs, exactly. Any other block (cpp, cmake, ...), or one that cannot run as written here (two machines, a Slurm
cluster, an excerpt of a larger program), is an illustration: the line above its fence says so,
`<!-- illustration: why -->`, and it is skipped, named by that why. An unmarked block of another
language fails the page: a new block either runs or says why it does not.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

RUN = {"sh", "c", "python"}
NOT_CODE = {"", "text"}
FENCE = re.compile(r"^(\s*)```(\S*)")
ILLUSTRATION = re.compile(r"<!--\s*illustration:\s*(.+?)\s*-->")
EXPECTED_OUTPUT = re.compile(r"<!--\s*output:\s*(.+?)\s*-->")
ELISION = re.compile(r"…|\.\.\.")
TIMEOUT_S = 600


class Block:
    def __init__(self, page, line, language, body, illustration, expected_output=False):
        self.page, self.line, self.language, self.body, self.illustration = page, line, language, body, illustration
        self.expected_output = expected_output

    def name(self):
        return "%s:%d (%s)" % (os.path.basename(self.page), self.line, self.language or "text")


def blocks_of(page):
    """The page's fenced blocks, each with the illustration marker of the line above its fence."""
    with open(page) as f:
        lines = f.read().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        above = lines[i - 1] if i > 0 else ""
        marker = ILLUSTRATION.search(above)
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            sys.exit("%s:%d: a block that never closes" % (page, i + 1))
        found.append(Block(page, i + 1, language, "\n".join(body) + "\n", marker.group(1) if marker else None,
                           language in NOT_CODE and EXPECTED_OUTPUT.search(above) is not None))
        i = j + 1
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$")
EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"')


def anchors_of(page):
    """The anchors GitHub gives a page: each heading's text, lowercased, punctuation but - and _ dropped,
    spaces as -, repeats numbered; and every <a id>."""
    anchors, seen, fenced = set(), {}, False
    with open(page) as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            anchors.update(EXPLICIT_ANCHOR.findall(line))
            heading = HEADING.match(line)
            if heading and not fenced:
                slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
                count = seen.get(slug, 0)
                seen[slug] = count + 1
                anchors.add(slug if count == 0 else "%s-%d" % (slug, count))
    return anchors


def broken_links(page):
    """The page's relative links that name no file, or no anchor of the page they name."""
    broken = []
    with open(page) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(file):
            broken.append("%s (no such file)" % target)
        elif anchor and file.endswith(".md") and anchor not in anchors_of(file):
            broken.append("%s (no such heading in %s)" % (target, os.path.basename(file)))
    return broken


def ci_runs_the_test_command(page, script):
    """The README's second command (install, build, every test) is what CI runs, word for word."""
    with open(page) as f:
        lines = f.read().splitlines()
    numbered = [i for i, line in enumerate(lines) if line.startswith("# 2.")]
    if not numbered:
        sys.exit("%s has no '# 2.' command" % page)
    following = [line for line in lines[numbered[0] + 1:] if not line.startswith("#")]
    command = " ".join(following[0].split())
    with open(script) as f:
        ci = " ".join(f.read().replace("\\\n", " ").split())
    if command not in ci:
        sys.exit("%s does not run the README's test command: %s" % (script, command))
    print("ok: %s runs the README's test command" % os.path.basename(script))


def missing_lines(expected, printed):
    """The lines of `expected` (a text block) that no line of `printed` matches, "…" standing for any text."""
    printed_lines = [line.rstrip() for line in printed.splitlines()]
    missing = []
    for line in filter(None, (line.rstrip() for line in expected.splitlines())):
        pattern = re.compile(".*".join(re.escape(part) for part in ELISION.split(line)))
        if not any(pattern.fullmatch(candidate) for candidate in printed_lines):
            missing.append(line)
    return missing


def scratch_folder(source, build):
    """A folder holding links to the source tree's entries, build/ being the build folder."""
    folder = tempfile.mkdtemp(prefix="doc-blocks-")
    for entry in os.listdir(source):
        if entry in ("build", ".git"):
            continue
        os.symlink(os.path.join(source, entry), os.path.join(folder, entry))
    os.symlink(build, os.path.join(folder, "build"))
    return folder


def command_of(block, folder, build):
    """What runs the block: an argument list for bash, or None where it is not code."""
    if block.language == "sh":
        return ["bash", "-e", "-o", "pipefail", "-c", block.body]
    launcher = [os.path.join(build, "bin", "bpl-run"), "--nproc-per-node", "2"]
    if block.language == "c":
        if "main(" not in block.body:
            sys.exit("%s: a C block without main; mark it <!-- illustration: why --> or make it a program"
                     % block.name())
        program = os.path.join(folder, "doc-block-%d" % block.line)
        with open(program + ".c", "w") as f:
            f.write(block.body)
        build_it = ["cc", "-std=c99", "-Wall", "-Werror", "-I", os.path.join(folder, "core", "include"),
                    program + ".c", "-o", program, "-L", os.path.join(build, "lib"), "-lbackplane",
                    "-Wl,-rpath," + os.path.join(build, "lib")]
        run_it = ["env", "NXD_CPU_MODE=1", *launcher, program]
        return ["bash", "-e", "-c", shlex.join(build_it) + " && " + shlex.join(run_it)]
    if block.language == "python":
        program = os.path.join(folder, "doc-block-%d.py" % block.line)
        with open(program, "w") as f:
            f.write(block.body)
        python = os.environ.get("BPL_PYTHON", sys.executable)
        path = os.pathsep.join([os.path.join(build, "python"), os.path.join(folder, "python")])
        ranks = ["env", "NXD_CPU_MODE=1", "PYTHONPATH=" + path, *launcher, python, program]
        if re.search(r"^import backplane$", block.body, re.M) and "torch.distributed" not in block.body:
            alone = ["env", "NXD_CPU_MODE=1", "PYTHONPATH=" + path, python, program]
            return ["bash", "-e", "-c", shlex.join(alone) + " && " + shlex.join(ranks)]
        return ranks
    return None


def main():
    page, source, build = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    blocks = blocks_of(page)
    unmarked = [b for b in blocks if b.illustration is None and b.language not in RUN | NOT_CODE]
    if unmarked:
        sys.exit("blocks of a language that does not run, not marked as illustrations: "
                 + ", ".join(b.name() for b in unmarked))
    broken = broken_links(page)
    if broken:
        sys.exit("links that lead nowhere: " + ", ".join(broken))
    if "--ci-script" in sys.argv:
        ci_runs_the_test_command(page, sys.argv[sys.argv.index("--ci-script") + 1])
    if "--list" in sys.argv:
        for b in blocks:
            print(b.name(), "illustration: " + b.illustration if b.illustration else
                  ("runs" if b.language in RUN else "not code"))
        return
    folder = scratch_folder(source, build)
    ran = skipped = 0
    try:
        for index, block in enumerate(blocks):
            if block.illustration is not None:
                print("skipped %s: an illustration (%s)" % (block.name(), block.illustration), flush=True)
                skipped += 1
                continue
            command = command_of(block, folder, build)
            if command is None:
                continue
            print("running %s:\n%s" % (block.name(), block.body), flush=True)
            shown = []  # the expected-output blocks right after this one, each checked against its output
            for following in blocks[index + 1:]:
                if not following.expected_output:
                    break
                shown.append(following)
            expected = "".join(b.body for b in shown) or None
            try:
                finished = subprocess.run(command, cwd=folder, timeout=TIMEOUT_S, check=False, text=True,
                                          stdout=subprocess.PIPE if expected else None,
                                          stderr=subprocess.STDOUT if expected else None)
            except subprocess.TimeoutExpired:
                sys.exit("FAILED %s: still running after %d s" % (block.name(), TIMEOUT_S))
            if expected is not None:
                sys.stdout.write(finished.stdout)
            if finished.returncode != 0:
                sys.exit("FAILED %s: exit status %d" % (block.name(), finished.returncode))
            if expected is not None and missing_lines(expected, finished.stdout):
                sys.exit("FAILED %s: its output, shown in %s, lacks:\n  %s" % (
                    block.name(), ", ".join(b.name() for b in shown),
                    "\n  ".join(missing_lines(expected, finished.stdout))))
            ran += 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("passed: %s, %d block(s) run, %d illustration(s) skipped" % (os.path.basename(page), ran, skipped))


if __name__ == "__main__":
    main()
