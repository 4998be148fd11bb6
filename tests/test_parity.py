"""minGPT's idea: the real checkpoint in bertkit and in HF transformers gives the same numbers."""
import torch
from helpers import SENTENCES

from bertkit import WordPieceTokenizer, load_model


def test_minilm_matches_hf_bert_model_on_a_padded_batch(minilm_folder):
    from transformers import BertModel as HFBert
    ours, _ = load_model(minilm_folder, heads=False)
    hf = HFBert.from_pretrained(str(minilm_folder)).eval()
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    for pairs in (None, SENTENCES[::-1]):
        batch = tok.encode(SENTENCES, pairs)
        assert (batch.attention_mask == 0).any()  # padding really is exercised
        with torch.no_grad():
            a = ours(**batch.model_inputs())
            b = hf(**batch.model_inputs())
        mask = batch.attention_mask.bool()
        assert (a.sequence_output - b.last_hidden_state)[mask].abs().max() <= 1e-4
        assert (a.pooled_output - b.pooler_output).abs().max() <= 1e-4
