"""Studies: experiments that drive training and evaluation together and compare their results (`head_study`:
how much a trained score head helps, heads x seeds against no head)."""
