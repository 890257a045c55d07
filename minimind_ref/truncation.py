"""Reporting truncation: how many examples of a chat dataset ``max_length`` cut into.

``sft.SFTDataset`` and ``dpo.DPODataset`` count, in their ``truncation`` dict, the examples that
lost their whole answer (``no_answer``) or the end of one with its ``<|im_end|>`` (``cut_answer``,
see ``sft.truncation_kind``) out of ``examples``, and warn with ``truncation_note``; the training
loop (``train.train``) repeats the note for the data it is given. The sentence lives here, below
both, so that neither the datasets nor the loop import the other for it.
"""

from __future__ import annotations

from typing import Any, Dict


def truncation_note(counts: Dict[str, int], what: str, max_length: Any, dropped: bool) -> str:
    """One sentence about ``counts`` (``{"examples": n, "no_answer": a, "cut_answer": b}``)."""
    parts = []
    if counts.get("no_answer"):
        parts.append(f"{counts['no_answer']} lost their whole answer (the prompt alone fills max_length={max_length})")
    if counts.get("cut_answer"):
        parts.append(f"{counts['cut_answer']} lost the end of an answer with its <|im_end|> at max_length={max_length} "
                     "(trained so, a model learns not to stop)")
    fix = ("they were left out (drop_truncated=True)" if dropped else
           "raise max_length, shorten them, or pass drop_truncated=True to leave them out")
    return f"of {counts.get('examples', 0)} {what}, {' and '.join(parts)}; {fix}."
