"""Small HTML building blocks shared by report.html and the diff report.

Every string that can come from a trace (op names, stream names, session directories, rule
messages that quote them) goes through :func:`esc` or :func:`inline`; nothing else inserts text.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from traceanalyzer.printable import printable
from traceanalyzer.report import fmt
from traceanalyzer.report.width import shorten_middle

STYLE = (Path(__file__).with_name("style.css")).read_text("utf-8")

# Marks <body data-images-loaded="N"> once every <img> decoded (naturalWidth > 0), or "error"
# otherwise: lets a headless browser test assert the plots really render.
IMAGES_SCRIPT = """<script>
(function(){function check(){var imgs=[].slice.call(document.images);
if(!imgs.every(function(i){return i.complete;})){return setTimeout(check,20);}
var ok=imgs.every(function(i){return i.naturalWidth>0;});
document.body.setAttribute('data-images-loaded',ok?String(imgs.length):'error');}
if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',check);}else{check();}})();
</script>"""

_CODE = re.compile(r"`([^`\n]+)`")
# A word this long is a name (a kernel, an op, a path): its cell may break it anywhere, so a
# wide table fits its box instead of pushing its last columns out of view. Shorter words
# (AI_VECTOR_CORE) never break.
_LONG_NAME = re.compile(r"\S{24,}")
# a name column's cell (a kernel's name) is shortened in the middle beyond this, whole on hover
HTML_NAME = 48


def esc(value: Any) -> str:
    """HTML-escape anything (``None`` -> empty), quotes included, without control characters
    (HTML has no use for them; a line feed is kept)."""
    return "" if value is None else html.escape(printable(value, lines=True), quote=True)


def inline(text: Any) -> str:
    """Escape, then render `code` spans (the only markup rule messages use)."""
    return _CODE.sub(r"<code>\1</code>", esc(text))


def paragraphs(text: Any) -> str:
    return "".join(f"<p>{inline(line)}</p>" for line in str(text or "").splitlines() if line)


def name_cell(name: Any, width: int = HTML_NAME) -> str:
    """A name (a kernel's, an op's) as HTML: shortened in the middle beyond ``width``
    characters (its start and end tell it), the whole name in its title (shown on hover)."""
    whole = "" if name is None else str(name)
    if len(whole) <= width:
        return esc(whole)
    return f'<span title="{esc(whole)}">{esc(shorten_middle(whole, width))}</span>'


def change_cell(rel: float | None, better: bool | None) -> str:
    """A relative change (:func:`~traceanalyzer.report.fmt.change`), green when ``better``, red
    when worse ("" when unknown)."""
    kind = {True: "delta-good", False: "delta-bad"}.get(better, "")  # type: ignore[arg-type]
    text = fmt.change(rel)
    return f'<span class="{kind}">{esc(text)}</span>' if text else ""


def chip(text: Any, kind: str = "plain") -> str:
    return f'<span class="chip {esc(kind)}">{esc(text)}</span>'


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Sequence[int] = (),
    raw: Sequence[int] = (),
    names: Sequence[int] = (),
) -> str:
    """A table; cells are escaped except columns listed in ``raw`` (already-built HTML);
    those of ``names`` are names, shortened by :func:`name_cell`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            content = cell if i in raw else name_cell(cell) if i in names else esc(cell)
            if i in numeric:
                cls = ' class="num"'
            elif i not in raw and _LONG_NAME.search(str(cell)):
                cls = ' class="name"'
            else:
                cls = ""
            cells.append(f"<td{cls}>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def bullets(items: Iterable[str], kind: str = "plain") -> str:
    """A list of ``items`` (HTML already built), of class ``kind``."""
    return f'<ul class="{kind}">' + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def details(summary: str, body: str, open_: bool = False) -> str:
    """A collapsible block; ``summary`` is escaped, ``body`` is HTML."""
    return f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>{body}</details>"


def img_png(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def page(title: str, body: str) -> str:
    """A complete, self-contained page: inline CSS, no external resource of any kind."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # forbid any network fetch: the report must work offline and leak nothing
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main>{IMAGES_SCRIPT}</body></html>\n"
    )
