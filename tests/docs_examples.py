"""The python examples of README.md and docs/*.md, as the tests run them (see docs/README.md):
every ```python block, a page's blocks in order; a block under ``<!-- no-run: why -->`` is not
run; a block under ``<!-- NAME-example ... -->`` is found by that marker on any page."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)     # fences at a line start
NO_RUN = re.compile(r"<!-- no-run: [^>]*\S[^>]*-->\s*$")


def pages():
    """README.md, then every page in docs/ (a new page is picked up by itself)."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def python_blocks(page: Path):
    """(first line number, code, runs) for each ```python block of ``page``."""
    text = page.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 2
        blocks.append((line, match.group(1), not NO_RUN.search(before)))
    return blocks


def marked_example(marker: str):
    """(code, page) of the ```python block right after ``marker`` (e.g. "<!-- write-example"),
    wherever it now lives."""
    found = [(page, text) for page in pages() for text in [page.read_text()] if marker in text]
    assert len(found) == 1, f"{marker} is on {[str(p) for p, _ in found] or 'no page'}"
    page, text = found[0]
    return BLOCK.search(text[text.index(marker):]).group(1), page


def command_lines(page: Path, after: str = "", until: str = "\n## "):
    """Every ``tfsurgery <subcommand> ...`` line of ``page`` (in a fenced or an indented block)
    from the heading ``after`` to the next heading, as argv lists, comments dropped."""
    import shlex
    text = page.read_text()
    section = text
    if after:
        start = text.index(after)
        end = text.find(until, start + len(after))
        section = text[start:end if end >= 0 else len(text)]
    return [shlex.split(line.strip(), comments=True) for line in section.splitlines()
            if COMMAND.match(line)]


# a command line: at a line's start (a fenced block) or indented 4 (an indented block)
COMMAND = re.compile(r"^(?: {4})?tfsurgery (?:optimize|inspect|export|bench|compare|batch) ")
