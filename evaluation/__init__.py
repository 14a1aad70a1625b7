"""Evaluation, apart from the benchmark that uses it: the datasets (``datasets``), their graders
(``graders``), the HumanEval sandbox (``sandbox``, ``sandbox_runner``) and the calibration prompts
drawn from the datasets' calibration splits (``calibration_set``). Imported as ``csd.evaluation``."""
