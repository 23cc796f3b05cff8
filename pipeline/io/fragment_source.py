"""Ray Data's side of fragments.py: a datasource whose read tasks are the input's fragments."""

from __future__ import annotations

import functools

import ray.data

from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from pipeline.io.fragments import INPUT_SCHEMA, Fragment, fragment_blocks

BYTES_PER_ROW = 100  # Ray Data's size estimate of a record in memory: short sentences and their ids


class FragmentSource(Datasource):
    """One read task per fragment, however many Ray asks for: the fragments were sized for it (FRAGMENT_ROWS).
    Each yields blocks of `block_rows` rows, the size the job's actors and writers want, so that no
    repartition (a stage of tasks of its own, a CPU each) stands between the reads and the actors."""

    def __init__(self, fs, input_config, fragments: list[Fragment], block_rows: int):
        super().__init__()
        self.fs, self.input_config, self.fragments, self.block_rows = fs, input_config, fragments, block_rows

    def estimate_inmemory_data_size(self) -> int:
        return sum(fragment.rows for fragment in self.fragments) * BYTES_PER_ROW

    def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None) -> list[ReadTask]:
        return [ReadTask(functools.partial(fragment_blocks, self.fs, self.input_config, fragment, self.block_rows),
                         BlockMetadata(num_rows=fragment.rows, size_bytes=fragment.rows * BYTES_PER_ROW,
                                       exec_stats=None, input_files=(fragment.path,)),
                         schema=INPUT_SCHEMA, per_task_row_limit=per_task_row_limit)
                for fragment in self.fragments]


def read_input(fs, input_config, fragments: list[Fragment], block_rows: int) -> ray.data.Dataset:
    """The fragments as a lazy Ray dataset of records in INPUT_SCHEMA, in blocks of at most `block_rows` rows:
    one read task per fragment."""
    return ray.data.read_datasource(FragmentSource(fs, input_config, fragments, block_rows))
