"""bertkit: BERT end to end on PyTorch, compatible with the HuggingFace checkpoint layout."""
import importlib

# Names load on first use (PEP 562): `python -m bertkit` imports torch only for the commands
# that need it (`encode --backend onnx` runs on ONNX Runtime alone, 1.5-2 s sooner).
_EXPORTS = {"BertConfig": ".config", "PRESETS": ".config", "BertModel": ".model", "BertForPreTraining": ".model",
            "WordPieceTokenizer": ".tokenizer", "Encoder": ".inference.encode", "load_model": ".folders",
            "save_model": ".folders", "BertkitError": ".errors"}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    try:  # a submodule, as `import bertkit; bertkit.model` found it when the package imported everything
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module 'bertkit' has no attribute {name!r}") from None
