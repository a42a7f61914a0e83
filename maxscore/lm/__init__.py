"""Language-model pretraining on local text and the reranker fine-tuning pairs built from it.

`corpus` collects the text every Python install carries (CPython's pydoc_data reference topics and
the standard library's docstrings and sources), holding out chosen reference sections;
`tokenizer_training` trains the small sentencepiece tokenizers; `pretrain` trains a decoder on the text
with the next-token loss; `pairs` turns the same text into rerank training queries (heading -> paragraphs,
hard negatives from BM25) for fine-tuning the whole model; `default_set` builds the embedded rerank data
(JSONL form, BEIR layout, BM25 first-stage run); `assets` runs every step into the embedded default.
"""
