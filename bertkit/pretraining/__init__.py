"""Pretraining BERT from raw text: corpus, vocabulary, NSP pairs, MLM masking, shards, the loop."""
