"""The tiny hybrid decoder: byte tokenizer, chat template, random weights, paged forward."""
