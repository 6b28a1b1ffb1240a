"""The embedded engine over several ranks: `moelab serve --tp-size N [--ep-size E]`.

    layout.py   which heads, experts and intermediate rows each rank holds (plain arithmetic)
    shard.py    a rank's slice of whole weights (dense tensors; experts via ExpertWeights)
    moe.py      the expert-parallel MoE of one rank: local dispatch, partial combine
    plan.py     rank 0's commands as int64 tensors; the other ranks' copies of its sequences
    group.py    torch.distributed: the store, the process groups, collectives with timeouts
    star.py     rank 0's socket to each rank: commands, and the custom all-reduce of CPU ranks
    ranks.py    the rank processes: rank 0 leads and watches, the others follow, all die together
    worker.py   the entry point of ranks 1..N-1
    ranklog.py  SGLang's `[time TPr]` line prefix;  faults.py  failures on purpose, for tests

Nothing here imports torch at package import, so validating flags stays cheap.
"""
