"""Reading inputs and writing outputs through fsspec (local disk, S3, any fsspec URL)."""
