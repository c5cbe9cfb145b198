"""Reading chart files back in tests: an SVG's series, ids and texts (llmkit.plot's ids), a PNG's size."""

import struct
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def svg_series(path, panel: int) -> set[str]:
    """The series of one panel: ids `series-P-S` (a bar series' bars are `series-P-S-J`)."""
    ids = [e.get("id") for e in ET.parse(path).getroot().iter() if e.get("id")]
    return {"-".join(i.split("-")[:3]) for i in ids if i.startswith(f"series-{panel}-")}


def svg_ids(path, prefix: str) -> list[str]:
    return [e.get("id") for e in ET.parse(path).getroot().iter() if (e.get("id") or "").startswith(prefix)]


def svg_texts(path) -> list[str]:
    return ["".join(e.itertext()) for e in ET.parse(path).getroot().iter(f"{SVG}text")]


def png_size(path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature; Pillow decodes it."""
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    with Image.open(path) as im:
        im.load()  # every chunk decodes: a valid image, not just a header
        assert im.size == struct.unpack(">II", data[16:24])
    return struct.unpack(">II", data[16:24])


def svg_notes(path, prefix: str) -> list[str]:
    """The texts of the elements whose id starts with `prefix` (a series' point notes: `note-P-S-`)."""
    return ["".join(e.itertext()).strip() for e in ET.parse(path).getroot().iter()
            if (e.get("id") or "").startswith(prefix)]
