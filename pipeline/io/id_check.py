"""The input's ids checked on the workers: none missing, none repeated, the driver holding no id.

Each fragment's task hashes its ids (64 bits) and splits the hashes into buckets (hash modulo the number of
buckets); one task per bucket sorts what every fragment sent it and answers the hashes that repeat. Only
then are the ids behind those hashes read again and counted, so a hash collision between two ids is never
reported as a repeat. The driver holds object references, a few per fragment, and the few ids it names.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.fragments import Fragment, read_fragment
from pipeline.io.storage import InputError

MAX_BUCKETS = 64
EXAMPLES = 5  # repeated ids named in the error


def _hashes(ids: pa.Array) -> np.ndarray:
    import pandas as pd

    return pd.util.hash_array(ids.to_numpy(zero_copy_only=False)).astype(np.uint64)


def _hash_fragment(fs, input_config, fragment: Fragment, buckets: int):
    """(rows, ids missing), then the fragment's id hashes in `buckets` parts (hash modulo `buckets`)."""
    ids = read_fragment(fs, input_config, fragment, ids_only=True)["id"].combine_chunks()
    missing = ids.null_count
    hashes = _hashes(ids.drop_null())
    part = hashes % np.uint64(buckets)
    return ((len(ids), missing), *(hashes[part == bucket] for bucket in range(buckets)))


def _repeated_hashes(*parts: np.ndarray) -> np.ndarray:
    together = np.sort(np.concatenate(parts)) if parts else np.array([], np.uint64)
    return np.unique(together[1:][together[1:] == together[:-1]])


def _ids_with_hashes(fs, input_config, fragment: Fragment, wanted: np.ndarray) -> pa.Array:
    ids = read_fragment(fs, input_config, fragment, ids_only=True)["id"].combine_chunks().drop_null()
    return ids.filter(pa.array(np.isin(_hashes(ids), wanted)))


def check_unique_ids(fs, input_config, fragments: list[Fragment]) -> list[int]:
    """The rows of each fragment, once its ids are known to be there and unique (else InputError, naming
    some repeated ids). Runs as Ray tasks on the connected cluster."""
    import ray

    if not fragments:
        return []
    buckets = max(1, min(MAX_BUCKETS, len(fragments)))
    hash_task = ray.remote(num_cpus=1)(_hash_fragment).options(num_returns=buckets + 1)
    handed = [hash_task.remote(fs, input_config, fragment, buckets) for fragment in fragments]
    repeat_task = ray.remote(num_cpus=1)(_repeated_hashes)
    repeated = ray.get([repeat_task.remote(*[refs[1 + bucket] for refs in handed]) for bucket in range(buckets)])
    counts = ray.get([refs[0] for refs in handed])
    missing = sum(nulls for _, nulls in counts)
    if missing:
        raise InputError(f"{missing} input record(s) have no id (a null or empty id)")
    wanted = np.concatenate(repeated)
    if len(wanted):
        _name_repeats(fs, input_config, fragments, wanted)
    return [rows for rows, _ in counts]


def _name_repeats(fs, input_config, fragments: list[Fragment], wanted: np.ndarray) -> None:
    import ray

    find = ray.remote(num_cpus=1)(_ids_with_hashes)
    found = ray.get([find.remote(fs, input_config, fragment, wanted) for fragment in fragments])
    counts = pc.value_counts(pa.concat_arrays(found))
    repeats = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeats):
        examples = ", ".join(f"{item['values']!r} x{item['counts']}" for item in repeats[:EXAMPLES].to_pylist())
        raise InputError(f"{len(repeats)} input id(s) occur more than once, e.g. {examples}; ids must be unique")
