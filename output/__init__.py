"""What a request hands back: the text a step's tokens become and where the output stops.

reasoning.py: the one splitter of a Reasoning output into thinking and answer (engine and server).
"""
