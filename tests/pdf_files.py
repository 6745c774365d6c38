"""PDFs made in the tests: one page of text lines, or blank pages."""

from __future__ import annotations

import io

import pypdf


def pdf_of(*lines: str) -> bytes:
    """A one-page PDF whose text layer holds ``lines`` (Helvetica, one line each)."""
    text = "".join(f"BT /F1 12 Tf 72 {720 - 16 * i} Td ({line}) Tj ET\n" for i, line in enumerate(lines))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text.encode()),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (n, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def blank_pages(n: int) -> bytes:
    writer = pypdf.PdfWriter()
    for _ in range(n):
        writer.add_blank_page(72, 72)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
