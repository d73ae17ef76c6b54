"""One target to files, in the export child: the upstream config, each component's export, the save.

```
convert.py (a target's upstream config; export each component, one in memory at a time)
   ├─► onnx_files.py        one external-data file for every ONNX component
   ├─► transformers_js.py   the folder transformers.js loads
   ├─► quantize.py          a variant's quantizer
   └─► footprint.py         total and stored weight bytes, read from the files' own structure
```

A sibling of `validate/`: neither imports the other (validation reads what export wrote, from disk).
"""
