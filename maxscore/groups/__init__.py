"""The offline producers of training groups files (the group JSONL that maxscore/datasets/groups.py reads as a
rerank set): hard-negative mining from a first stage (`mining`), and teacher scores written into the groups or
measured as a run (`teacher`, with its transformers bi-encoder in `bi_encoder`)."""
