"""Tensor parallelism (--tensor-parallel-size T): one replica as T processes on
torch.distributed, gloo on a CPU and NCCL on GPUs.

    rank 0   the scheduler process: scheduler loop, sampling, every ZeroMQ socket; it
             starts ranks 1..T-1 (or torchrun does) and sends each step's inputs
    rank r   a follower: the same forward on its shard, on rank 0's steps

    ranks.py         the start, the rendezvous (a free port, or torchrun's environment),
                     stopping, a dead rank noticed
    group.py         the process group and its collectives (timeout; gloo's float32 upcast)
    partition.py     which heads, MLP columns and vocabulary rows a rank holds
    layers.py        row-parallel o_proj / down_proj, vocabulary-parallel embedding and head
    weights.py       each rank's slice of each checkpoint tensor
    step_channel.py  a step's inputs as one int64 broadcast (no pickle)
    follower.py      the followers' loop
"""
