"""Direct preference optimisation (chapter 11): align the chat model to preference pairs without
a reward model, as upstream's ``trainer/train_dpo.py`` does (jingyaogong/minimind at d65ef2c).

A preference pair is one prompt with a *chosen* and a *rejected* reply. DPO compares how much
more the trained model (the *policy*) likes each reply than a frozen copy of the starting model
(the *reference*) does::

    r(y)  = beta * (log pi(y | x) - log pi_ref(y | x))           the implicit reward
    loss  = -log sigmoid(r(chosen) - r(rejected))                 averaged over the pairs

Upstream's ``log pi(y | x)`` at d65ef2c is the **sum** of the log-probabilities of the reply's
tokens (the DPO paper's form, ``--beta`` 0.15: ``d65ef2c:trainer/train_dpo.py:34-37``,
``d65ef2c:trainer/train_dpo.py:152``). c090b69 (MiniMind2) took the **mean** per assistant token
instead (the masked sum divided by the number of masked tokens, clamped so an empty mask gives 0
instead of NaN; upstream issue #298: ``c090b69:trainer/train_dpo.py:33-38 "clamp_min(1e-8)"``). Both are here: ``reduction="sum"``
(default) and ``reduction="mean"`` (c090b69's variant). Under the sum a long reply has a larger
log-probability gap to move than a short one, so the loss weighs long pairs more; under the mean
every pair weighs the same whatever its length.

Batches follow upstream's layout: the first half of the rows are the chosen replies, the second
half the rejected ones, pair ``i`` in rows ``i`` and ``i + B``. Shapes: ``logits`` ``[2B, T, V]``,
per-token log-probabilities and masks ``[2B, T]``, per-sequence values ``[2B]``, per-pair values
``[B]``.

* ``logits_to_log_probs``, ``dpo_loss``: upstream's two functions;
* ``sequence_log_probs``, ``implicit_rewards``, ``dpo_pair_stats``: the pieces, for logging;
* ``DPODataset``: preference records (``{"chosen": [...], "rejected": [...]}``) as upstream's
  ``DPODataset`` encodes them (chat template, assistant mask, inputs ``ids[:-1]``, targets
  ``ids[1:]``, mask shifted with the targets);
* ``DPOObjective``: the objective ``minimind_ref.train`` optimises, holding the frozen reference;
* ``train_dpo`` / ``build_stage``: the shipped ``dpo`` stage.
"""

from __future__ import annotations

import copy
import hashlib
import math
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .datafiles import example_list
from .sft import (_check_max_length, assistant_loss_mask, encode_chat, has_reply, marker_ids, merged_newline_ids,
                  truncation_kind)
from .truncation import truncation_note

if TYPE_CHECKING:  # pragma: no cover
    from .train import RunData, TrainConfig, TrainResult

REDUCTIONS = ("sum", "mean")
DPO_CONFIG = "ch11_dpo"  # minimind_ref/configs/ch11_dpo.json: the loop's settings of the shipped `dpo` stage
# What the loop's config cannot hold: the DPO settings of the shipped stage (recorded in dpo.pt).
STAGE_SETTINGS: Dict[str, Any] = {"beta": 0.15, "reduction": "sum", "n_train": 1000, "n_own_prompts": 1000,
                                  "own_temperature": 1.0, "n_val": 120, "empty_think_ratio": 1.0}


# ---------------------------------------------------------------------- upstream's functions
def logits_to_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under the logits at the same position.

    ``logits`` ``[batch, seq, vocab]``, ``labels`` ``[batch, seq]`` (already shifted: position
    ``t`` holds the token the logits at ``t`` predict) -> ``[batch, seq]``. Upstream's
    ``logits_to_log_probs``: ``log_softmax`` over the vocabulary, then ``gather`` the labels."""
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [batch, seq, vocab] and labels [batch, seq] with the same batch and seq; "
                         f"got logits {tuple(logits.shape)} and labels {tuple(labels.shape)}.")
    log_probs = F.log_softmax(logits, dim=2)
    return torch.gather(log_probs, dim=2, index=labels.unsqueeze(2)).squeeze(-1)


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'sum' (upstream at d65ef2c and the DPO paper: the reply's "
                         f"log-probability) or 'mean' (c090b69: the average over the reply's tokens), got {reduction!r}.")


def _check_beta(beta: float) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a positive finite number (upstream's default is 0.15), got {beta!r}; with "
                         "beta = 0 the loss no longer depends on the model.")


def sequence_log_probs(log_probs: torch.Tensor, mask: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Per-sequence log-probability of the masked tokens: ``[batch, seq]`` -> ``[batch]``.

    ``"sum"`` (upstream at d65ef2c, the paper): ``(log_probs * mask).sum(1)``, the
    log-probability of the whole reply. ``"mean"`` (c090b69): ``(log_probs * mask).sum(1) /
    mask.sum(1).clamp_min(1e-8)``, the average per masked token; a row with no masked token gives
    0, not NaN. The masked tokens are selected (``torch.where``), not multiplied by the mask: a NaN
    or -inf where the mask is 0 (NaN * 0 is NaN) changes neither the result nor its gradient."""
    _check_reduction(reduction)
    if log_probs.shape != mask.shape or log_probs.dim() != 2:
        raise ValueError(f"log_probs and mask must both be [batch, seq]; got {tuple(log_probs.shape)} and "
                         f"{tuple(mask.shape)}.")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"mask must hold 0 and 1 only (1 where a token counts), got values {mask.unique().tolist()[:6]}.")
    keep = mask.bool()
    total = torch.where(keep, log_probs, torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)).sum(dim=1)
    if reduction == "sum":
        return total
    return total / keep.sum(dim=1).clamp_min(1).to(total.dtype)


def _split_pairs(values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    n = values.shape[0]
    if n % 2:
        raise ValueError(f"a DPO batch holds the chosen rows then the rejected rows, so it needs an even number of "
                         f"rows; got {n}.")
    return values[: n // 2], values[n // 2 :]


def dpo_loss(ref_log_probs: torch.Tensor, policy_log_probs: torch.Tensor, mask: torch.Tensor, beta: float = 0.15,
             reduction: str = "sum") -> torch.Tensor:
    """Upstream's ``dpo_loss`` (scalar; d65ef2c), with c090b69's per-token mean as an option.

    ``ref_log_probs``, ``policy_log_probs``, ``mask`` ``[2B, T]``: rows ``0..B-1`` are the chosen
    replies, rows ``B..2B-1`` the rejected ones. Per sequence, the masked log-probabilities are
    summed (``reduction="sum"``, d65ef2c and the paper) or averaged (``"mean"``, c090b69); then
    ``-logsigmoid(beta * ((pi_c - pi_r) - (ref_c - ref_r)))`` averaged over the ``B`` pairs."""
    _check_beta(beta)
    if ref_log_probs.shape != policy_log_probs.shape:
        raise ValueError(f"ref_log_probs {tuple(ref_log_probs.shape)} and policy_log_probs "
                         f"{tuple(policy_log_probs.shape)} must have the same shape.")
    if ref_log_probs.shape == mask.shape:
        bad = mask.bool() & ~torch.isfinite(ref_log_probs.detach())
        if bool(bad.any()):
            raise ValueError(f"ref_log_probs holds {int(bad.sum())} NaN/inf value(s) at positions the mask counts: "
                             "the reference model's log-probabilities must be finite there (do its weights hold NaN "
                             "or inf?). This is not the learning rate's doing.")
    ref = sequence_log_probs(ref_log_probs, mask, reduction)
    policy = sequence_log_probs(policy_log_probs, mask, reduction)
    ref_chosen, ref_rejected = _split_pairs(ref)
    policy_chosen, policy_rejected = _split_pairs(policy)
    logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    return (-F.logsigmoid(beta * logits)).mean()


def implicit_rewards(policy_seq_log_probs: torch.Tensor, ref_seq_log_probs: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward of each sequence, ``beta * (log pi - log pi_ref)`` (same shape)."""
    _check_beta(beta)
    return beta * (policy_seq_log_probs - ref_seq_log_probs)


def dpo_pair_stats(ref_log_probs: torch.Tensor, policy_log_probs: torch.Tensor, mask: torch.Tensor, beta: float,
                   reduction: str = "sum") -> Dict[str, torch.Tensor]:
    """Everything the chapter logs about a batch of pairs, each ``[B]`` (one value per pair):

    ``policy_chosen`` / ``policy_rejected`` / ``ref_chosen`` / ``ref_rejected`` (sequence
    log-probabilities, reduced as in ``dpo_loss``), ``reward_chosen`` / ``reward_rejected``
    (implicit rewards), ``margin`` (= ``reward_chosen - reward_rejected``), ``loss``
    (``-logsigmoid(margin)``; its mean is ``dpo_loss``) and ``correct`` (1.0 where the margin is
    positive: the policy prefers the chosen reply more than the reference does)."""
    ref_chosen, ref_rejected = _split_pairs(sequence_log_probs(ref_log_probs, mask, reduction))
    policy_chosen, policy_rejected = _split_pairs(sequence_log_probs(policy_log_probs, mask, reduction))
    reward_chosen = implicit_rewards(policy_chosen, ref_chosen, beta)
    reward_rejected = implicit_rewards(policy_rejected, ref_rejected, beta)
    margin = reward_chosen - reward_rejected
    return {"policy_chosen": policy_chosen, "policy_rejected": policy_rejected, "ref_chosen": ref_chosen,
            "ref_rejected": ref_rejected, "reward_chosen": reward_chosen, "reward_rejected": reward_rejected,
            "margin": margin, "loss": -F.logsigmoid(margin), "correct": (margin > 0).float()}


# ---------------------------------------------------------------------- the data
def encode_reply(tokenizer: Any, messages: Sequence[Dict[str, Any]], max_length: int,
                 drop_empty_think: bool = False) -> Tuple[List[int], List[int]]:
    """``(ids, mask)`` of one side of a pair, before the shift: the conversation encoded with the
    chat template (``sft.encode_chat``; ``drop_empty_think``: without the empty thinking block, as
    ``post_processing_chat`` renders it) and cut to ``max_length`` tokens; the mask is upstream's
    ``generate_loss_mask`` (``sft.assistant_loss_mask``: every assistant reply, its
    ``<|im_end|>`` and the newline after it)."""
    bos, eos = marker_ids(tokenizer)
    ids = encode_chat(tokenizer, messages, drop_empty_think=drop_empty_think)[:max_length]
    return ids, assistant_loss_mask(ids, bos, eos, max_length, merged_newline_ids(tokenizer))


def _prompt_of(messages: Sequence[Any]) -> List[Any]:
    """The messages before the conversation's last assistant reply (what both sides of a pair share)."""
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"), default=0)
    return list(messages[:last])


class DPODataset:
    """Preference records ``{"chosen": [messages], "rejected": [messages]}`` for DPO.

    Upstream's ``DPODataset`` semantics (d65ef2c): each side is rendered with the chat template,
    the empty thinking blocks dropped with probability ``1 - empty_think_ratio``
    (``post_processing_chat``), cut to ``max_length`` tokens and masked with the assistant loss
    mask; then shifted, ``x = ids[:-1]``, ``y = ids[1:]``, ``mask = mask[1:]`` (so ``mask[t]``
    says whether the *target* ``y[t]`` is an assistant token). One difference: upstream draws the
    thinking-block removal for the chosen and the rejected side independently, so a pair can
    compare a reply with the block against one without it; here one draw per pair (from
    ``random.Random(seed)``) decides for both sides, so the two replies differ only in their
    text. ``self[i]`` is what upstream returns (each tensor right-padded with ``pad_id`` to
    ``max_length - 1``); ``batch(indices)`` pads only to the widest row of the batch (both sides
    alike): right padding has mask 0 and cannot change a real position under the causal mask, so
    the loss is the same and short batches are cheaper. Both return upstream's keys ``x_chosen,
    y_chosen, mask_chosen, x_rejected, y_rejected, mask_rejected`` (``long``).

    Checked, where upstream trains on anything: a record whose chosen and rejected conversations
    have different prompts (the messages before the last assistant reply) is a ``ValueError``, and
    so is one whose two conversations are the same (it holds no preference: its loss is the
    constant log 2 and its gradient 0). Truncation is counted as in ``sft.SFTDataset``: ``self.truncation`` counts the
    pairs with a side that lost its whole answer (``no_answer``: that side's log-probability is
    0, the pair only adds noise) or the end of it (``cut_answer``), with a warning;
    ``drop_truncated=True`` leaves them out."""

    KEYS = ("x_chosen", "y_chosen", "mask_chosen", "x_rejected", "y_rejected", "mask_rejected")

    def __init__(self, records: Sequence[Dict[str, Any]], tokenizer: Any, max_length: int = 256, pad_id: int = 0,
                 empty_think_ratio: float = 0.2, seed: int = 0, drop_truncated: bool = False) -> None:
        import random

        from .sft import EMPTY_THINK, render_chat

        _check_max_length(max_length)
        if isinstance(empty_think_ratio, bool) or not isinstance(empty_think_ratio, (int, float)) \
                or not 0 <= empty_think_ratio <= 1:
            raise ValueError(f"empty_think_ratio must be a probability in [0, 1], got {empty_think_ratio!r}.")
        self.max_length, self.pad_id = max_length, pad_id
        # records read from a file (datafiles.JsonlRecords) keep their encodings on disk, not in memory
        self.pairs: List[Tuple[List[int], List[int], List[int], List[int]]] = example_list(records, 4)
        self.kinds: List[Optional[str]] = []
        self.truncation: Dict[str, int] = {"examples": 0, "no_answer": 0, "cut_answer": 0, "dropped": 0,
                                         "max_length": max_length}
        self.truncated: List[int] = []
        same: List[int] = []
        bos, eos = marker_ids(tokenizer)
        merged = merged_newline_ids(tokenizer)
        rng = random.Random(seed)
        for n, record in enumerate(records):
            if not isinstance(record, dict) or "chosen" not in record or "rejected" not in record:
                raise ValueError(f"record {n} must have 'chosen' and 'rejected' conversations (upstream's DPO format): "
                                 f"{record!r:.100}")
            for side in ("chosen", "rejected"):
                if not isinstance(record[side], (list, tuple)) or not has_reply(record[side]):
                    raise ValueError(f"record {n}: the {side} conversation has no assistant reply; each side of a "
                                     "preference pair ends with the assistant's turn (upstream's DPO format).")
            if record["chosen"] == record["rejected"]:
                same.append(n)
                continue
            prompts = [_prompt_of(record[side]) for side in ("chosen", "rejected")]
            if prompts[0] != prompts[1]:
                turn = next((i for i, (a, b) in enumerate(zip(*prompts)) if a != b), min(map(len, prompts)))
                raise ValueError(f"record {n}: the chosen and rejected conversations have different prompts (they "
                                 f"differ at message {turn}: {prompts[0][turn:turn + 1]!r:.80} vs "
                                 f"{prompts[1][turn:turn + 1]!r:.80}); a preference pair is two replies to one prompt, "
                                 "so everything before the last assistant reply must be the same on both sides.")
            drop = EMPTY_THINK in render_chat(record["chosen"]) and rng.random() > empty_think_ratio
            full = (encode_chat(tokenizer, record["chosen"], drop_empty_think=drop),
                    encode_chat(tokenizer, record["rejected"], drop_empty_think=drop))
            self.truncation["examples"] += 1
            kinds = {truncation_kind(ids, max_length, bos, eos) for ids in full} - {None}
            if kinds:
                kind = "no_answer" if "no_answer" in kinds else "cut_answer"
                self.truncation[kind] += 1
                self.truncated.append(n)
                if drop_truncated:
                    self.truncation["dropped"] += 1
                    continue
            chosen, rejected = ((ids[:max_length], assistant_loss_mask(ids[:max_length], bos, eos, max_length, merged))
                                for ids in full)
            self.pairs.append((*chosen, *rejected))
            self.kinds.append(record.get("kind"))
        if same:
            raise ValueError(
                f"{len(same)} record(s) have the same conversation as 'chosen' and 'rejected' (first: record {same[0]}); "
                "such a pair states no preference (its DPO loss is the constant log 2, its gradient 0). Remove them "
                "from the data."
            )
        if self.truncated:
            warnings.warn("DPODataset: " + truncation_note(self.truncation, "pairs", max_length, drop_truncated),
                          stacklevel=2)

    def __len__(self) -> int:
        return len(self.pairs)

    @staticmethod
    def _shift(ids: List[int], mask: List[int], width: int, pad_id: int) -> Tuple[torch.Tensor, ...]:
        ids = ids + [pad_id] * (width + 1 - len(ids))
        mask = mask + [0] * (width + 1 - len(mask))
        return (torch.tensor(ids[:-1], dtype=torch.long), torch.tensor(ids[1:], dtype=torch.long),
                torch.tensor(mask[1:], dtype=torch.long))

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        ids_c, mask_c, ids_r, mask_r = self.pairs[i]
        width = self.max_length - 1
        return dict(zip(self.KEYS, self._shift(ids_c, mask_c, width, self.pad_id) + self._shift(ids_r, mask_r, width, self.pad_id)))

    def batch(self, indices: Any) -> Dict[str, torch.Tensor]:
        rows = [self.pairs[int(i)] for i in indices]
        width = max(max(len(r[0]), len(r[2])) for r in rows) - 1
        columns: List[List[torch.Tensor]] = [[] for _ in self.KEYS]
        for ids_c, mask_c, ids_r, mask_r in rows:
            for column, tensor in zip(columns, self._shift(ids_c, mask_c, width, self.pad_id)
                                      + self._shift(ids_r, mask_r, width, self.pad_id)):
                column.append(tensor)
        return {key: torch.stack(column) for key, column in zip(self.KEYS, columns)}

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for pair in self.pairs:
            h.update(str(pair).encode())
        return h.hexdigest()[:16]


def concat_pairs(batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, mask)`` with the chosen rows first, then the rejected rows, as upstream's loop
    concatenates them (``[2B, T]`` each)."""
    missing = [k for k in DPODataset.KEYS if k not in batch]
    if missing:
        raise ValueError(f"a DPO batch needs the keys {DPODataset.KEYS}; missing {missing}.")
    shapes = {k: tuple(batch[k].shape) for k in DPODataset.KEYS}
    if len(set(shapes.values())) != 1 or len(shapes["x_chosen"]) != 2:
        raise ValueError(f"every tensor of a DPO batch must be [pairs, seq] with one row per pair on each side (row i "
                         f"of the chosen and of the rejected tensors is pair i), all of one shape; got {shapes}.")
    x = torch.cat([batch["x_chosen"], batch["x_rejected"]], dim=0)
    y = torch.cat([batch["y_chosen"], batch["y_rejected"]], dim=0)
    mask = torch.cat([batch["mask_chosen"], batch["mask_rejected"]], dim=0)
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"mask_chosen and mask_rejected must hold 0 and 1 only (1 where a target token counts), got "
                         f"values {mask.unique().tolist()[:6]}.")
    return x, y, mask


# ---------------------------------------------------------------------- the objective
def check_reference(policy: torch.nn.Module, ref_model: Optional[torch.nn.Module]) -> None:
    """Refuse a reference that is the policy itself or shares its parameters (``ValueError``,
    raised before anything is changed): the reference must stay fixed while the policy trains,
    and freezing it would freeze the policy too."""
    if ref_model is None or not isinstance(ref_model, torch.nn.Module):
        return
    policy_storage = {p.data_ptr() for p in policy.parameters() if p.data_ptr()}
    if ref_model is policy or any(p.data_ptr() in policy_storage for p in ref_model.parameters()):
        raise ValueError("ref_model is the policy itself (or shares its parameters): the reference must stay fixed "
                         "while the policy trains, and freezing it would freeze the policy. Pass ref_model='copy' (the "
                         "default: a frozen copy made before training) or ref_model=freeze_reference(model).")


def freeze_reference(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``model`` to serve as the reference: eval mode, ``requires_grad`` off
    (upstream loads the SFT weights a second time and does the same)."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


class DPOObjective:
    """DPO as an objective for ``minimind_ref.train``: ``objective(model, batch) -> metrics``.

    Holds the frozen reference (eval mode, no gradient, ``requires_grad`` off). Per batch, as
    upstream's loop: concatenate chosen and rejected rows, reference log-probabilities under
    ``no_grad``, policy log-probabilities with gradient, ``loss = dpo_loss + aux_loss`` (the MoE
    balancing term, 0 for dense models). ``ref_model=None`` is the chapter's ablation "no
    reference model": the reference log-probabilities are taken as 0, so the loss only compares
    the policy's chosen and rejected log-probabilities.

    Returned metrics (means over the batch's pairs, detached): ``dpo_loss``, ``aux_loss``,
    ``policy_chosen``, ``policy_rejected``, ``ref_chosen``, ``ref_rejected`` (sequence
    log-probabilities as reduced), ``reward_chosen``, ``reward_rejected``, ``margin``,
    ``reward_accuracy`` (pairs with a positive margin), ``kl`` (mean per-token KL(pi || pi_ref)
    over the supervised tokens, exact over the vocabulary; 0 without a reference) and ``tokens``
    (supervised targets; a batch with none is skipped by the loop)."""

    def __init__(self, ref_model: Optional[torch.nn.Module], beta: float = 0.15, reduction: str = "sum") -> None:
        _check_beta(beta)
        _check_reduction(reduction)
        if ref_model is not None:
            ref_model.eval()
            ref_model.requires_grad_(False)
        self.ref_model, self.beta, self.reduction = ref_model, float(beta), reduction

    def _reference_logits(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        if self.ref_model is None:
            return None
        if next(self.ref_model.parameters()).device != x.device:
            self.ref_model.to(x.device)
        self.ref_model.eval()
        with torch.no_grad():
            return self.ref_model(x).logits.detach()

    def __call__(self, model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        check_reference(model, self.ref_model)
        x, y, mask = concat_pairs(batch)
        ref_logits = self._reference_logits(x)
        out = model(x)
        policy_lp = logits_to_log_probs(out.logits, y)
        if ref_logits is None:
            ref_lp = torch.zeros_like(policy_lp).detach()
        else:
            ref_lp = logits_to_log_probs(ref_logits, y)
        loss = dpo_loss(ref_lp, policy_lp, mask, self.beta, self.reduction)
        with torch.no_grad():
            stats = dpo_pair_stats(ref_lp, policy_lp.detach(), mask, self.beta, self.reduction)
            tokens = mask.sum()
            if ref_logits is None:
                kl = torch.zeros((), device=x.device)
            else:
                logp = F.log_softmax(out.logits.detach().float(), dim=-1)
                logq = F.log_softmax(ref_logits.float(), dim=-1)
                per_token = (logp.exp() * (logp - logq)).sum(-1)
                kl = per_token[mask.bool()].sum() / tokens.clamp_min(1)  # selected: no NaN from left-out positions
        aux = out.aux_loss
        metrics = {"loss": loss + aux, "dpo_loss": loss.detach(), "aux_loss": aux.detach(), "tokens": tokens,
                   "reward_accuracy": stats["correct"].mean(), "kl": kl}
        for name in ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected", "reward_chosen",
                     "reward_rejected", "margin"):
            metrics[name] = stats[name].mean()
        return metrics


# ---------------------------------------------------------------------- evaluation
@torch.no_grad()
def pair_log_probs(model: torch.nn.Module, dataset: DPODataset, reduction: str = "sum",
                   batch_size: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)``: the model's sequence log-probabilities of every pair's replies
    (reduced as in ``dpo_loss``), ``[len(dataset)]`` each, in eval mode."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    try:
        for start in range(0, len(dataset), batch_size):
            batch = dataset.batch(range(start, min(len(dataset), start + batch_size)))
            x, y, mask = (t.to(device) for t in concat_pairs(batch))
            seq = sequence_log_probs(logits_to_log_probs(model(x).logits.float(), y), mask, reduction)
            c, r = _split_pairs(seq)
            chosen.append(c.cpu())
            rejected.append(r.cpu())
    finally:
        model.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


def preference_report(model: torch.nn.Module, ref_model: torch.nn.Module, dataset: DPODataset, beta: float = 0.15,
                      reduction: str = "sum",
                      ref_pair_log_probs: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> Dict[str, float]:
    """Held-out DPO measurements of ``model`` against ``ref_model`` on ``dataset``:
    ``reward_accuracy`` (pairs where the policy prefers the chosen reply more than the reference
    does), ``margin`` (mean implicit-reward margin), ``policy_accuracy`` (pairs whose chosen reply
    the policy itself scores higher), ``chosen_change`` / ``rejected_change`` (mean change of the
    sequence log-probabilities from the reference) and, with ``dataset.kinds``, the reward
    accuracy of each kind of pair (``reward_accuracy_<kind>``). ``ref_pair_log_probs``: the
    reference's ``pair_log_probs(ref_model, dataset, reduction)``, when already computed (it is
    the same for every policy compared with one reference)."""
    _check_beta(beta)
    pc, pr = pair_log_probs(model, dataset, reduction)
    rc, rr = ref_pair_log_probs if ref_pair_log_probs is not None else pair_log_probs(ref_model, dataset, reduction)
    if rc.shape != pc.shape or rr.shape != pr.shape:
        raise ValueError(f"ref_pair_log_probs must be two tensors of shape {tuple(pc.shape)} (one value per pair), "
                         f"got {tuple(rc.shape)} and {tuple(rr.shape)}.")
    margin = beta * ((pc - rc) - (pr - rr))
    out = {"reward_accuracy": float((margin > 0).float().mean()), "margin": float(margin.mean()),
           "policy_accuracy": float((pc > pr).float().mean()), "chosen_change": float((pc - rc).mean()),
           "rejected_change": float((pr - rr).mean())}
    kinds = sorted({k for k in dataset.kinds if k is not None})
    for kind in kinds:
        idx = torch.tensor([k == kind for k in dataset.kinds])
        out[f"reward_accuracy_{kind}"] = float((margin[idx] > 0).float().mean())
    return out


@torch.no_grad()
def mean_kl(model: torch.nn.Module, ref_model: torch.nn.Module, dataset: DPODataset, batch_size: int = 64) -> float:
    """Drift from the reference: the mean per-token KL(pi || pi_ref), exact over the vocabulary,
    at the assistant positions of the chosen replies of ``dataset`` (teacher-forced)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    try:
        for start in range(0, len(dataset), batch_size):
            batch = dataset.batch(range(start, min(len(dataset), start + batch_size)))
            x, mask = batch["x_chosen"].to(device), batch["mask_chosen"].to(device)
            logp = F.log_softmax(model(x).logits.float(), dim=-1)
            logq = F.log_softmax(ref_model(x).logits.float(), dim=-1)
            per_token = (logp.exp() * (logp - logq)).sum(-1)
            total += float(per_token[mask.bool()].sum())
            count += float(mask.sum())
    finally:
        model.train(was_training)
    return total / max(count, 1.0)


# ---------------------------------------------------------------------- the DPO stage
@torch.no_grad()
def own_reply_pairs(model: torch.nn.Module, tokenizer: Any, n_prompts: int, seed: int = 0, split: str = "train",
                    temperature: float = 1.0, max_new_tokens: int = 96) -> List[Dict[str, Any]]:
    """On-policy preference pairs: ``n_prompts`` exchanges of ``split`` (``chat_data.random_exchange``:
    sums, stories, identity, refusals), one reply of ``model`` to each, sampled at
    ``temperature`` (seeded by ``seed``); every wrong reply becomes a pair ``{"chosen": the right
    answer, "rejected": the model's own reply}`` (``"kind"``: ``"own_<kind>"``). The rejected
    side is what this model actually says, so DPO moves probability where the model errs."""
    import random

    from . import chat_data
    from .sft import generate_replies

    chat_data._check_count(n_prompts, "n_prompts")
    rng = random.Random(seed * 7919 + 17)
    exchanges = [chat_data.random_exchange(rng, split) for _ in range(n_prompts)]
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        replies = generate_replies(model, tokenizer, [[{"role": "user", "content": ex.user}] for ex in exchanges],
                                   max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, generator=g)
    finally:
        model.train(was_training)
    out = []
    for ex, reply in zip(exchanges, replies):
        if reply["text"].strip() == ex.answer.strip() or not reply["stopped"]:
            continue
        user = [{"role": "user", "content": ex.user}]
        out.append({"chosen": user + [{"role": "assistant", "content": ex.answer}],
                    "rejected": user + [{"role": "assistant", "content": reply["text"]}], "kind": f"own_{ex.kind}"})
    return out


def dpo_data(tokenizer: Any, n_train: int = 1000, n_val: int = 120, seed: int = 0, max_length: int = 256,
             kinds: Optional[Sequence[str]] = None, extra_pairs: Sequence[Dict[str, Any]] = (),
             empty_think_ratio: float = 0.2) -> "RunData":
    """Generated preference pairs (``chat_data.dpo_preference_pairs``: wrong sums, rambling,
    made-up answers and drill lines given to requests that are not sums, in turn) plus
    ``extra_pairs`` (e.g. ``own_reply_pairs``) as a ``train.RunData``: the training split and a
    held-out split, both ``DPODataset``."""
    from . import chat_data
    from .train import RunData

    kinds = tuple(kinds) if kinds is not None else chat_data.DPO_PAIR_KINDS
    records = (chat_data.dpo_preference_pairs(n_train, seed, "train", kinds) if n_train else []) + list(extra_pairs)
    train_set = DPODataset(records, tokenizer, max_length, empty_think_ratio=empty_think_ratio, seed=seed)
    val_set = DPODataset(chat_data.dpo_preference_pairs(n_val, 0, "test", kinds), tokenizer, max_length,
                         empty_think_ratio=empty_think_ratio, seed=0)
    return RunData(tokenizer, train_set, val_set, [])


def train_dpo(model: torch.nn.Module, tokenizer: Any, cfg: "Optional[TrainConfig]" = None, beta: float = 0.15,
              reduction: str = "sum", ref_model: Any = "copy", data: "Optional[RunData]" = None,
              n_train: int = 1000, seed: int = 0, **train_kwargs: Any) -> "TrainResult":
    """DPO with ``minimind_ref.train``'s loop; ``model`` (the policy) is trained in place.

    ``ref_model``: ``"copy"`` (default) freezes a copy of ``model`` before training, as upstream
    does; a module is used as given (frozen; the policy itself is refused, see ``check_reference``);
    ``None`` trains without a reference (the ablation). The default evaluation logs the objective's metrics on ``data.val``
    (``history["eval_reward_accuracy"]``, ``eval_margin``, ...). Returns the ``TrainResult``;
    the objective (with its reference) is ``result.objective``."""
    from .train import TrainConfig, evaluate_objective, train

    if isinstance(ref_model, str) and ref_model != "copy":
        raise ValueError(f"ref_model must be 'copy', a model, or None (no reference), got {ref_model!r}.")
    check_reference(model, ref_model)
    cfg = cfg if cfg is not None else TrainConfig.from_json(DPO_CONFIG)
    if isinstance(ref_model, str):
        ref_model = freeze_reference(model)
    data = data if data is not None else dpo_data(tokenizer, n_train=n_train, seed=seed, max_length=cfg.seq_len)
    objective = DPOObjective(ref_model, beta=beta, reduction=reduction)

    def evaluate(policy: torch.nn.Module, step: int) -> Dict[str, float]:
        if data.val is None or not len(data.val):
            return {}
        device = next(policy.parameters()).device
        return evaluate_objective(policy, data.val, objective, cfg.batch_size, cfg.eval_batches, device)

    train_kwargs.setdefault("evaluate", evaluate)
    result = train(cfg, model=model, data=data, objective=objective, **train_kwargs)
    result.objective = objective  # type: ignore[attr-defined]
    return result


def build_stage(parent: torch.nn.Module, tokenizer: Any, seed: int = 0) -> Tuple[torch.nn.Module, Dict[str, Any], Any]:
    """The shipped ``dpo`` stage: ``train_dpo`` on the ``sft`` stage with ``DPO_CONFIG`` and
    ``STAGE_SETTINGS`` (``python -m minimind_ref.stages rebuild dpo``): generated pairs plus the
    parent's own wrong replies to training prompts (``own_reply_pairs``); ``seed`` draws both and
    orders the batches (the shipped stage: 0)."""
    from .train import TrainConfig

    s = STAGE_SETTINGS
    cfg = TrainConfig.from_json(DPO_CONFIG).replace(progress=False, out_dir=None, seed=seed)
    ref = freeze_reference(parent)
    own = own_reply_pairs(parent, tokenizer, s["n_own_prompts"], seed, temperature=s["own_temperature"]) \
        if s["n_own_prompts"] else []
    data = dpo_data(tokenizer, n_train=s["n_train"], n_val=s["n_val"], seed=seed, max_length=cfg.seq_len,
                    extra_pairs=own, empty_think_ratio=s["empty_think_ratio"])
    result = train_dpo(parent, tokenizer, cfg, beta=s["beta"], reduction=s["reduction"], ref_model=ref, data=data,
                       log=lambda line: None)
    held_out = preference_report(result.model, ref, data.val, s["beta"], s["reduction"])
    extra = {"recipe": "minimind_ref.dpo:build_stage", "command": "python -m minimind_ref.stages rebuild dpo",
             "train_config": cfg.to_dict(), "dpo_settings": dict(s), "seed": seed,
             "metrics": {"final_train_loss_mean20": sum(result.history["dpo_loss"][-20:]) / 20,
                         "own_pairs": len(own), "train_pairs": len(data.train),
                         "heldout_reward_accuracy": held_out["reward_accuracy"], "heldout_margin": held_out["margin"],
                         "heldout_chosen_change": held_out["chosen_change"],
                         "heldout_rejected_change": held_out["rejected_change"],
                         "heldout_mean_kl": mean_kl(result.model, ref, data.val)}}
    return result.model, extra, tokenizer
