"""The column names of the frameworks' own datasets, for `managed-scorers score --preset` (a module
of its own, with no imports, so the CLI's parser can name them without loading the dataset readers).

TRL: `prompt` and `completion` (strings, or chat messages in its conversational format), the gold in
`solution` (as its math datasets keep it). verl: the output of its generation (`main_generation`:
prompts as chat messages, `responses` added), the gold nested in `reward_model.ground_truth` and
the `data_source`, as its `main_eval` reads them.
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, str]] = {
    "trl": {"prompt": "prompt", "response": "completion", "reference": "solution"},
    "verl": {
        "prompt": "prompt",
        "response": "responses",
        "reference": "reward_model.ground_truth",
        "data_source": "data_source",
    },
}
