"""Data: readers of bertkit's training file formats (readers.py), and the built-in real data
sets, one file per source (rotten_tomatoes.py, tweets.py, wnut16.py, squad_subset.py, aclsum.py,
wordnet_attributes.py) with what they share (common.py) and `export` by name (registry.py).
Nothing is imported here: a task reading its files never loads a data set's builder."""
