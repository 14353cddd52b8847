"""Hand-written queries for the held-out set, written as a CAD user would phrase them and independently
of the templates in ``cad.SEEN_TEMPLATES`` / ``cad.HELDOUT_TEMPLATES`` (no template sentence frame, words
chosen freely; some words never occur in training). Each free-text query names its truth as a spec of
``cad.SPECS``; its operand set on a part is ``cad.target_ids(prims, spec)``, so on a part without that
feature the right answer is "no match" (an absent-feature query).

The lists were fixed before any model was trained on the current templates and are not edited to follow
results. ``TRAIN_FOREIGN`` (features these parts never have, used with an empty target in training) and
``TEST_FOREIGN`` share no feature noun.
"""
from __future__ import annotations

# (query, spec)
FREE_TEXT: list[tuple[str, tuple[str, str, str, str]]] = [
    ("fillet the upright corner edges around the outside", ("edges", "vertical straight", "sides", "")),
    ("soften the vertical edges where two side walls meet", ("edges", "vertical straight", "sides", "")),
    ("chamfer every corner edge running from the base up to the top", ("edges", "vertical straight", "sides", "")),
    ("break the sharp straight edges along the top face", ("edges", "straight", "top", "")),
    ("fillet the straight edges bounding the upper face", ("edges", "straight", "top", "")),
    ("chamfer the straight edges along the base where the part sits", ("edges", "straight", "bottom", "")),
    ("ease the linear edges at the very bottom of the part", ("edges", "straight", "bottom", "")),
    ("fillet the rim of each hole where it meets the top surface", ("edges", "circular", "top", "")),
    ("round the circular edges on the upper face", ("edges", "circular", "top", "")),
    ("chamfer the round openings on the top", ("edges", "circular", "top", "")),
    ("chamfer the circular edges underneath the part", ("edges", "circular", "bottom", "")),
    ("deburr the round edges on the bottom face", ("edges", "circular", "bottom", "")),
    ("fillet the biggest circle on the top face", ("edges", "circular", "top", "largest")),
    ("round only the widest circular edge up top", ("edges", "circular", "top", "largest")),
    ("chamfer the smallest round edge on the upper surface", ("edges", "circular", "top", "smallest")),
    ("fillet the largest circle on the underside", ("edges", "circular", "bottom", "largest")),
    ("chamfer the smallest circular edge at the base", ("edges", "circular", "bottom", "smallest")),
    ("round the long straight edges on top", ("edges", "straight", "top", "longest")),
    ("chamfer the longest edges of the top face", ("edges", "straight", "top", "longest")),
    ("fillet the shorter straight edges across the top", ("edges", "straight", "top", "shortest")),
    ("fillet the straight edges of the step floor", ("edges", "straight", "step level", "")),
    ("chamfer the linear edges on the lower ledge", ("edges", "straight", "step level", "")),
    ("round the circular edges on the recessed ledge", ("edges", "circular", "step level", "")),
    ("select the flat face at the very top", ("faces", "planar", "top", "")),
    ("shell the part from its upper flat face", ("faces", "planar", "top", "")),
    ("select the face the part rests on", ("faces", "planar", "bottom", "")),
    ("pick the flat bottom face", ("faces", "planar", "bottom", "")),
    ("select the floor of the step", ("faces", "planar", "step level", "")),
    ("pick the flat ledge between the top and the bottom", ("faces", "planar", "step level", "")),
    ("select the curved walls", ("faces", "cylindrical", "sides", "")),
    ("pick every cylindrical surface", ("faces", "cylindrical", "sides", "")),
    ("select the largest curved face", ("faces", "cylindrical", "sides", "largest")),
    ("pick the smallest cylindrical wall", ("faces", "cylindrical", "sides", "smallest")),
]

# features none of the procedural parts has: used in training with an empty target ("no such feature")
TRAIN_FOREIGN = [
    "fillet the edges of the threaded hole", "chamfer the gear teeth", "select the spherical faces",
    "fillet the dovetail edges", "shell the knurled surface", "chamfer the countersink rim",
    "select the helical faces", "fillet the edges of the triangular cutout", "chamfer the rib edges",
    "select the tapered faces", "fillet the spline edges", "select the conical faces",
]
# features none of the parts has, with nouns never used in training: a test of "no such feature"
TEST_FOREIGN = [
    "fillet the edges of the hexagonal pocket", "chamfer the keyway edges", "select the toroidal faces",
    "fillet the corners of the star shaped boss", "select the faces of the thread", "chamfer the lip of the groove",
    "shell the dome", "fillet the edges of the elliptical slot", "select the sloped draft faces",
    "chamfer the pentagon edges",
]
# nonsense the CLI was shown by the hostile-input review, plus more of the same kind
TEST_NONSENSE = [
    "xyzzy plugh frobnicate", ";;;", "asdf qwer zxcv", "lorem ipsum dolor sit amet", "!!!???", "123 456",
    "blorp the snazzle", "mumble grumble", "qqq", "zork",
]
