"""The correction memory made and moved outside the decode loop: calibrated on a corpus (``calibrate``,
reading ``corpus``) and exchanged with SGLang as its CSD table (``sglang_table``)."""
