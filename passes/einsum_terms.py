"""An Einsum equation's letters per operand and output, explicit: what its gradient rule and its workspace read."""

from __future__ import annotations

import string
from collections.abc import Sequence

ELLIPSIS = "..."


def explicit_terms(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, with `...` spelled out as letters (right-aligned across operands,
    as broadcasting aligns them) and an implicit output made explicit (letters seen once, in order)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    unused = [c for c in string.ascii_letters if c not in equation]
    widest = max((rank - len(t.replace(ELLIPSIS, "")) for t, rank in zip(terms, ranks, strict=True)
                  if ELLIPSIS in t), default=0)
    spelled = "".join(unused[:widest])
    terms = [t.replace(ELLIPSIS, spelled[widest - (rank - len(t.replace(ELLIPSIS, ""))):])
             for t, rank in zip(terms, ranks, strict=True)]
    if not arrow:
        letters = "".join(terms)
        rhs = spelled + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in spelled))
    return terms, rhs.replace(ELLIPSIS, spelled)
