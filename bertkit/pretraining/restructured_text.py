"""The prose of reStructuredText (Sphinx) sources, one paragraph per line, for pretraining text:
headings, code, tables, comments and markup-only directives are dropped, inline markup becomes
the text it shows (":func:`~os.path.join`" -> "join", "``x``" -> "x", "`text <url>`_" -> "text").

docutils would parse the markup, but not Sphinx's own roles and directives without Sphinx, and
pretraining needs only the sentences; what is not prose is left out rather than half kept."""
from __future__ import annotations

import re

# Directives whose indented body is prose (admonitions, API descriptions); every other directive
# (code-block, toctree, index, table, image, productionlist, ...) is dropped with its body.
PROSE_DIRECTIVES = {
    "note", "warning", "caution", "attention", "danger", "error", "hint", "important", "tip", "seealso",
    "admonition", "topic", "sidebar", "deprecated", "versionadded", "versionchanged", "impl-detail",
    "glossary", "centered", "hlist", "function", "method", "class", "attribute", "data", "exception",
    "decorator", "decoratormethod", "classmethod", "staticmethod", "abstractmethod", "describe",
    "module", "cmdoption", "option", "envvar", "opcode", "pdbcommand", "audit-event", "c:function",
    "c:type", "c:member", "c:macro", "c:var", "c:struct",
}
_DIRECTIVE = re.compile(r"\.\.\s+([\w:+-]+)::")
_UNDERLINE = re.compile(r"([=\-~^\"'`#*+<>_:.])\1{2,}\s*$")
_FIELD = re.compile(r":[\w -]+:(\s|$)")  # a directive option (":noindex:") or a field list line
_TABLE = re.compile(r"[+|][-=+|\s]|[+|]\s*$|=+(\s+=+)+\s*$")
_LIST_MARK = re.compile(r"^([*+\-•]|#\.|\d+[.)]|\(\d+\)|[a-z][.)])\s+")
_INLINE = [
    (re.compile(r":[\w:+-]+:`!?~?([^`<]*?)(?:\s*<[^`>]*>)?`"), None),  # roles, target shown as its last part
    (re.compile(r"``(.+?)``"), r"\1"),
    (re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?"), r"\1"),  # `text <url>`_
    (re.compile(r"`([^`]+)`_{0,2}"), r"\1"),
    (re.compile(r"\*\*(\S(?:.*?\S)?)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])"), r"\1"),
    (re.compile(r"\s*\[(?:#\w*|\d+|\*)\]_"), ""),  # footnote references
    (re.compile(r"\|([\w -]+)\|_?"), r"\1"),  # substitutions
    (re.compile(r"\\(.)"), r"\1"),
]


def _role(match: re.Match) -> str:
    text = match.group(1).strip()
    whole = match.group(0)
    # ":func:`~os.path.join`" shows "join"; ":func:`os.path.join`" shows it all
    return text.rsplit(".", 1)[-1] if "`~" in whole or "`!~" in whole else text


def inline_text(text: str) -> str:
    for pattern, repl in _INLINE:
        text = pattern.sub(_role if repl is None else repl, text)
    return " ".join(text.split())


def _paragraph_text(lines: list[str]) -> str:
    text = " ".join(lines)
    if text.endswith(" ::") or text == "::":  # reST: "text ::" shows "text", "text::" shows "text:"
        text = text[:-2].rstrip()
    elif text.endswith("::"):
        text = text[:-1]
    return inline_text(_LIST_MARK.sub("", text, count=1))


def rest_paragraphs(source: str) -> list[str]:
    """The prose paragraphs of reST `source`, each as one line of plain text."""
    out: list[str] = []
    para: list[str] = []
    indent_of_para = 0
    skip_deeper: int | None = None  # drop the lines indented deeper than this (code, markup)
    session = False

    def end_paragraph():
        nonlocal skip_deeper
        if para:
            if para[-1].endswith("::"):  # a literal (code) block follows, indented deeper
                skip_deeper = indent_of_para
            text = _paragraph_text(para)
            if len(text.split()) >= 3 and re.search("[a-z]", text):  # not a label or a lone name
                out.append(text)
            para.clear()

    for line in source.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_deeper is not None:
            if not stripped or indent > skip_deeper:
                continue
            skip_deeper = None
        if session:  # an interactive session (">>>") ends at a blank line
            session = bool(stripped)
            continue
        if not stripped:
            end_paragraph()
        elif stripped.startswith(".."):
            end_paragraph()
            m = _DIRECTIVE.match(stripped)
            if not (m and m.group(1) in PROSE_DIRECTIVES):
                skip_deeper = indent  # a comment, a label, or a directive that is not prose
        elif _UNDERLINE.match(stripped):
            if len(para) == 1:  # the line above was a heading (an overline has none above)
                para.clear()
            end_paragraph()
        elif stripped.startswith((">>>", "$ ")):
            end_paragraph()
            session = True
        elif _TABLE.match(stripped) or (not para and _FIELD.match(stripped)):
            end_paragraph()  # a table, a directive's options: to the end of the block
            skip_deeper = indent
        else:
            if para and _LIST_MARK.match(stripped):
                end_paragraph()  # the next item of a list
            elif para and indent > indent_of_para + 1 and not _LIST_MARK.match(para[0]):
                end_paragraph()  # a block quote or definition body starts a paragraph of its own
                if skip_deeper is not None:
                    continue
            if not para:
                indent_of_para = indent
            para.append(stripped)
    end_paragraph()
    return out
