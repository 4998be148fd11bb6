"""bertkit: BERT end to end on PyTorch, compatible with the HuggingFace checkpoint layout."""
from .checkpoint import load_model, save_model
from .config import PRESETS, BertConfig
from .inference.encode import Encoder
from .errors import BertkitError
from .model import BertForPreTraining, BertModel
from .tokenizer import WordPieceTokenizer

__all__ = ["BertConfig", "PRESETS", "BertModel", "BertForPreTraining", "WordPieceTokenizer",
           "Encoder", "load_model", "save_model", "BertkitError"]
__version__ = "0.1.0"
