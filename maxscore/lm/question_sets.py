"""The natural-question sets, built from Debian's packages into the package assets (scripts/build_question_sets.py):

- perlfaq_beir/: the Perl FAQ's questions against every Perl pod (maxscore/lm/perlfaq_set.py), a test set on a
  corpus no maxscore model trains on;
- rfaq_beir/: the R FAQ's questions against the R manuals (maxscore/lm/rfaq_set.py), a second such test set;
- python_docs_beir/'s question splits: the Python FAQ's questions as questions_dev and questions_train
  (maxscore/lm/docs_questions.py), for selection and training on the corpus the keyword set already has.

    make question-sources                     # apt-get download perl-doc r-doc-html python3.11-doc, under out/
    python scripts/build_question_sets.py     # both, with configs/question_sets.yml's paths
"""

import dataclasses
import pathlib
from typing import Optional

from maxscore import errors
from maxscore.datasets import data
from maxscore.files import safety
from maxscore.lm import docs_questions, docs_set, perlfaq_set, rfaq_set

PERLFAQ_DIR = data.DEFAULT_EVAL_DIR
RFAQ_DIR = PERLFAQ_DIR.parent / "rfaq_beir"


@dataclasses.dataclass
class QuestionSetOptions:
  """scripts/build_question_sets.py's settings (configs/question_sets.yml documents each)."""
  perl_pod_dir: Optional[str] = None   # Perl's pod directory (Debian's perl-doc); None = the Perl FAQ set is kept
  perlfaq_dir: Optional[str] = None    # where the Perl FAQ set is written; None = the package's (PERLFAQ_DIR)
  r_manual_dir: Optional[str] = None   # R's HTML manuals (Debian's r-doc-html); None = the R FAQ set is kept
  rfaq_dir: Optional[str] = None       # where the R FAQ set is written; None = the package's (RFAQ_DIR)
  docs_html: Optional[str] = None      # the Python docs' HTML (python3.11-doc); None = the Python FAQ splits are kept
  docs_dir: Optional[str] = None       # the python-docs set the questions are added to (in place); None = the package's
  seed: int = 0                        # the draw of the dev questions
  dev_questions: int = 70              # Python FAQ questions in questions_dev (the rest train)
  max_words: int = 64                  # Perl and R passages: at most this many words
  bm25_top_k: int = 30                 # BM25 candidates per question in each set's run

  def validate(self) -> "QuestionSetOptions":
    for key in ("dev_questions", "max_words", "bm25_top_k"):
      if getattr(self, key) < 1:
        raise errors.ScoreInputError(f"{key}={getattr(self, key)} must be >= 1")
    return self


def _write(target: pathlib.Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    (target / name).parent.mkdir(parents=True, exist_ok=True)
    safety.atomic_write_text(target / name, text)


def build(options: QuestionSetOptions) -> dict:
  """Builds what `options` names; returns each set's counts."""
  if not options.perl_pod_dir and not options.r_manual_dir and not options.docs_html:
    # The defaults keep the shipped sets: a run that names no source has nothing to do, which is a mistake.
    raise errors.ScoreInputError("nothing to build: give --perl_pod_dir, --r_manual_dir, --docs_html or several "
                                 "(`make question-sources` unpacks the packages under out/)")
  out = {}
  if options.perl_pod_dir:
    files, stats = perlfaq_set.build_files(perlfaq_set.read_pods(options.perl_pod_dir), options.max_words,
                                           bm25_top_k=options.bm25_top_k)
    _write(pathlib.Path(options.perlfaq_dir or PERLFAQ_DIR), files)
    out["perlfaq"] = stats
  if options.r_manual_dir:
    files, stats = rfaq_set.build_files(rfaq_set.read_manuals(options.r_manual_dir), options.max_words,
                                        bm25_top_k=options.bm25_top_k)
    _write(pathlib.Path(options.rfaq_dir or RFAQ_DIR), files)
    out["rfaq"] = stats
  if options.docs_html:
    root = pathlib.Path(options.docs_dir or data.DEFAULT_DOCS_DIR)
    names = ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "bm25.trec")
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
      raise errors.ScoreInputError(f"{root} is not the python-docs set ({', '.join(missing)} missing)")
    sections = docs_set.read_sections(options.docs_html, subdirs=("faq",))
    files = docs_questions.question_files(sections, {n: (root / n).read_text(encoding="utf-8") for n in names},
                                          options.seed, options.dev_questions, options.bm25_top_k)
    _write(root, files)
    out["python_faq"] = {split: len({line.split("\t")[0] for line in files[f"qrels/{split}.tsv"].splitlines()[1:]})
                         for split in docs_questions.SPLITS}
  return out
