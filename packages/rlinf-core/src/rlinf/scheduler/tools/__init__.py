"""tools: what a person runs against a live cluster (``python -m rlinf.scheduler status``).

It may import every layer; nothing in ``rlinf.scheduler`` imports it except
the command line (``__main__``).
"""
