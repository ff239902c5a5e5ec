"""Data stages: ingest (documents table), validate (Great Expectations), tokenize (token store)."""
