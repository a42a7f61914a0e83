"""File safety: atomic writes, input/output overlap checks, ownership markers, and resume identity.

Every output maxscore writes goes through `safety` (written under a temporary name and renamed
into place; never equal to or inside an input; only directories carrying maxscore's marker are
ever removed), and every resumable run compares its `identity` with the one stored beside its
results (docs/ARCHITECTURE.md section 9).
"""

from maxscore.files.safety import (MARKER, atomic_output, atomic_write_text, is_owned, mark_owned,
                                   prepare_output_dir, refuse_overlap, remove_owned, replace_dir)

__all__ = ["MARKER", "atomic_output", "atomic_write_text", "is_owned", "mark_owned", "prepare_output_dir",
           "refuse_overlap", "remove_owned", "replace_dir"]
