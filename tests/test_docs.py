"""The docs are true to the code. Every ```python block of README.md and docs/*.md is one of three kinds,
told by an HTML comment on the line before it (invisible on GitHub):
- no comment: an example, run here in order, one namespace per page (a page reads top to bottom), in a
  temporary working directory, each print( line (or a bare name shown as a REPL shows it) printing what its comment says
  (printed_claims);
- `<!-- excerpt: PATH -->`: code quoted from PATH, whose lines must all appear there, in order;
- `<!-- run by: TEST -->`, TEST a file under tests/: run by that test with the context it needs (it must
  read the page)."""
import io
import itertools
import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)(?:<!-- (excerpt|run by): ([\w./-]+) -->\n\1)?```python\n(.*?)^\1```", re.S | re.M)


def python_blocks(page: Path) -> list[tuple[str, str, str]]:
    """(kind, path, code) for each python block: kind "example", "excerpt" or "run by"."""
    blocks = []
    for indent, kind, path, body in BLOCK.findall(page.read_text(encoding="utf-8")):
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in body.splitlines())
        blocks.append((kind or "example", path, code))
    return blocks


def _pages_with(kind):
    return [p for p in PAGES if any(k == kind for k, _, _ in python_blocks(p))]


def printed_claims(code: str) -> list[str | None]:
    """What each top-level print( line of an example says it prints, in order: its comment up to a ": " that starts
    prose (`print(x.shape)  # (1, 3): the leaf's shape`), or the comment lines right below a print without one
    (an array over several lines); None where it says nothing. "..." in a claim stands for anything (a loss)."""
    lines, claims = shown_as_printed(code).splitlines(), []
    for i, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comment = re.search(r"\)\s+# (.+)$", line)
        below = [s[2:] for s in itertools.takewhile(lambda s: s.startswith("# "), lines[i + 1:])]
        claims.append(comment.group(1).split(": ")[0] if comment else "\n".join(below) if below else None)
    return claims


SHOWN = re.compile(r"^([A-Za-z_][\w.]*)(\s+# .+)$", re.M)   # `x.grad   # Tensor(...)`: a value shown as a REPL shows it


def shown_as_printed(code: str) -> str:
    """The example with each line that shows a value as a REPL would (a bare name and its comment) printing repr()."""
    return SHOWN.sub(r"print(repr(\1))\2", code)


def _said(claim: str, printed: str) -> bool:
    """Whether `printed` is what `claim` says, spaces aside, "..." matching anything."""
    claim, printed = " ".join(claim.split()), " ".join(printed.split())
    return re.fullmatch(".*?".join(re.escape(part) for part in claim.split("...")), printed) is not None


@pytest.mark.parametrize("page", _pages_with("example"), ids=lambda p: p.name)
def test_every_example_of_the_page_runs_and_prints_what_its_comments_say(page, tmp_path):
    printed = []

    def record(*args, sep=" ", end="\n", file=None, flush=False):
        text = io.StringIO()
        print(*args, sep=sep, end=end, file=text)
        printed.append(text.getvalue())

    namespace = {"__name__": f"doc_{page.stem}", "print": record}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i, (kind, _, code) in enumerate(python_blocks(page)):
            if kind != "example":
                continue
            printed.clear()
            try:
                exec(compile(shown_as_printed(code), f"{page.name}[block {i}]", "exec"), namespace)
            except Exception as error:  # noqa: BLE001 - reported with the block
                pytest.fail(f"{page.name}, python block {i} raised {type(error).__name__}: {error}\n{code}")
            claims = printed_claims(code)
            assert len(printed) == len(claims), f"{page.name}, block {i}: a print( outside the top level"
            for claim, out in zip(claims, printed):
                assert claim is None or _said(claim, out), f"{page.name}, block {i} printed {out!r}, says {claim!r}"
    finally:
        os.chdir(cwd)


def test_a_claim_is_held_to_what_was_printed():
    code = "x = 1\nprint(x)   # 1: one\nprint(2)\n# [[ 0.  1.]\n#  [2.  3.]]\nprint(3)\nprint(4)  # loss ... True"
    assert printed_claims(code) == ["1", "[[ 0.  1.]\n [2.  3.]]", None, "loss ... True"]
    assert printed_claims("x.grad   # None: none asked\ny = x  # a copy") == ["None"]
    assert _said("[[ 0.  1.]\n [2.  3.]]", "[[ 0. 1.]\n  [2. 3.]]\n") and _said("loss ... True", "loss 2.71 True")
    assert not _said("1", "10") and not _said("loss ... True", "loss 2.71 False")


@pytest.mark.parametrize("page", _pages_with("excerpt"), ids=lambda p: p.name)
def test_every_excerpt_is_in_its_file_in_order(page):
    for kind, path, code in python_blocks(page):
        if kind != "excerpt":
            continue
        source = [line.strip() for line in (ROOT / path).read_text(encoding="utf-8").splitlines()]
        at = 0
        for line in filter(None, (line.strip() for line in code.splitlines())):
            try:
                at = source.index(line, at) + 1
            except ValueError:
                pytest.fail(f"{page.name} quotes {path}, but after line {at} it has no line {line!r}")


@pytest.mark.parametrize("page", _pages_with("run by"), ids=lambda p: p.name)
def test_blocks_run_elsewhere_name_a_test_that_reads_the_page(page):
    for kind, path, _ in python_blocks(page):
        if kind == "run by":
            assert f"docs/{page.name}" in (ROOT / path).read_text(encoding="utf-8"), (page.name, path)


def test_the_pages_have_examples_and_excerpts():
    kinds = [kind for p in PAGES for kind, _, _ in python_blocks(p)]
    assert kinds.count("example") >= 8 and kinds.count("excerpt") >= 2


def test_the_reading_order_of_docs_autograd_md_lists_every_engine_file_with_its_line_count():
    """The list at the top of docs/autograd.md: every file of tinygrad_ssm/autograd/, each with its `wc -l`."""
    text = (ROOT / "docs" / "autograd.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"`(tinygrad_ssm/autograd/[\w/]+\.py)` \((\d+)", text.split("\n## ", 1)[0]))
    engine = {str(p.relative_to(ROOT)) for p in (ROOT / "tinygrad_ssm" / "autograd").rglob("*.py")
              if p.name != "__init__.py" or p.parent.name == "autograd"}
    assert set(listed) == engine, (sorted(engine - set(listed)), sorted(set(listed) - engine))
    for path, lines in listed.items():
        actual = len((ROOT / path).read_text(encoding="utf-8").splitlines())
        assert int(lines) == actual, f"docs/autograd.md says {path} has {lines} lines; it has {actual}"


COMMAND = re.compile(r"python -m tinygrad_ssm ((?:train|generate|eval|export)\b[^`#\n]*)")


def test_every_command_the_pages_show_takes_the_flags_it_names(capsys):
    """A command a page shows (`python -m tinygrad_ssm eval --model M --data FILE`) names flags the command has: a
    renamed or removed flag fails here, not in a reader's shell. Placeholders (M, N, FMT) may be refused as values."""
    from tinygrad_ssm.train.arguments import build_parser
    commands = sorted({c.strip() for page in PAGES for c in COMMAND.findall(page.read_text(encoding="utf-8"))
                       if not c.startswith("train /")})
    assert len(commands) >= 10 and any("--init-from" in c for c in commands)
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command))
        except SystemExit:
            pass
        err = capsys.readouterr().err
        assert "unrecognized arguments" not in err and "expected one argument" not in err, (command, err)
