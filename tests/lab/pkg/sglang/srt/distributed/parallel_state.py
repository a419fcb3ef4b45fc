"""GroupCoordinator (sglang/srt/distributed/parallel_state.py)."""

import time


class GroupCoordinator:
    def all_reduce(self, input_):
        return self._all_reduce_out_place(input_)

    def _all_reduce_out_place(self, input_):
        # Waiting forever for peers that never join (LAB_FAULT_SPIN). Sleep, not spin:
        # the host thread of a hung NCCL collective costs the lab nothing.
        while True:
            time.sleep(0.05)


_TP = GroupCoordinator()


def get_tp_group():
    return _TP
