"""Using a model: contextual vectors (encode.py), fill-mask, attention weights, ONNX export and
the ONNX Runtime backend (export.py), and the HTTP server with its page (serve/, page/)."""
