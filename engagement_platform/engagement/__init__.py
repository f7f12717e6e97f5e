"""The engagement activity lake (reference 000/001): its tables and its streams."""
