"""Export: a job's results in input order, checked against its manifest, in one of the formats of `formats/`."""
