"""Parsers: one module per input format, each turning one file into canonical tables via a sink."""
