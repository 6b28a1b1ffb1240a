"""Turn the scheduler's choice for one step into the packed tensors the model runs (`StepBatch`).

Prefills contribute their whole prompt (positions 0..L-1), decodes their last token. Token order
is prefills first, then decodes; `last_index` points at each sequence's last packed token, whose
logits row samples its next token. With a slot table (CUDA) a decode token is described by its
lane and length alone; without one, by its padded list of cache slots and a mask.
"""
from __future__ import annotations

import torch

from moelab.engine.model import StepBatch
from moelab.engine.scheduler import Sequence


def build_step(prefill: list[Sequence], decode: list[Sequence], device: torch.device,
               slot_table: torch.Tensor | None = None) -> StepBatch:
    ids: list[int] = []
    pos: list[int] = []
    write: list[int] = []
    prefills: list[tuple[int, int]] = []
    last: list[int] = []
    for s in prefill:
        n = len(s.prompt_ids)
        prefills.append((len(ids), n))
        ids += s.prompt_ids
        pos += range(n)
        write += s.slots[:n]
        last.append(len(ids) - 1)
    rows: list[int] = []
    ctx = [s.length for s in decode]  # keys each decode token attends to, itself included
    for s in decode:
        p = s.length - 1
        rows.append(len(ids))
        last.append(len(ids))
        ids.append(s.output_ids[-1])
        pos.append(p)
        write.append(s.slots[p])

    def t(x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long).to(device, non_blocking=True)

    batch = StepBatch(input_ids=t(ids), positions=t(pos), write_slots=t(write), prefills=prefills,
                      decode_rows=t(rows), last_index=t(last))
    if slot_table is not None:
        batch.slot_table = slot_table
        batch.decode_lanes, batch.decode_lens = t([s.lane for s in decode]), t(ctx)
        return batch
    lmax = max(ctx, default=0)
    pad = torch.zeros(len(decode), lmax, dtype=torch.long)  # [Bd, Lmax]; padding points at slot 0, masked
    for b, s in enumerate(decode):
        if "slots_t" not in s.extra:  # the sequence's slots as a tensor, made once
            s.extra["slots_t"] = torch.tensor(s.slots, dtype=torch.long)
        pad[b, :ctx[b]] = s.extra["slots_t"][:ctx[b]]
    mask = torch.arange(lmax)[None, :] < torch.tensor(ctx, dtype=torch.long)[:, None]  # [Bd, Lmax]
    batch.decode_slots, batch.decode_mask = pad.to(device), mask[:, None, None, :].to(device)
    return batch
