"""Rollouts: from "a list of problems" to sampled completions (Algorithm 1, lines 2 and 7).

  1. the paper's two prompts (appendix, "Search Trace Prompt" and "Aggregation Trace Prompt"), word for word;
  2. `load_problems`: bundled JSONL sets (data/), a local JSONL file, or a Hub dataset (POLARIS-53K);
  3. `load_policy`: a Hugging Face causal LM, or "tiny" (tiny.py: built in code, runs offline on a CPU);
  4. `generate`: y ~ pi_theta(. | x) with Hugging Face `generate`, returning `Completion`s that carry the
     sampler's own log-probabilities (the denominator of train.py's importance ratio).

Choices the paper leaves open:
  1. Plain temperature sampling from the full softmax: no top-k, top-p, min-p or repetition penalty, whatever the
     model's generation_config.json says (Qwen3-4B-Instruct-2507 ships top_k=20, top_p=0.8, temperature=0.7).
     The policy gradient is only right if pi_theta is the distribution that was sampled.
  2. The N2 aggregation samples of one prompt share one prefill of it (`generate(share_prefix=True)`): the
     prompt's KV cache is computed once and copied N2 times. That saves prefill compute, not memory.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507"


# ----------------------------------------------------------------------------------------------------------------------
# 1. Prompts (paper appendix, word for word)

SEARCH_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

AGGREGATION_HEADER = (
    "You are given a problem and several candidate solution traces. "
    "Some candidate solutions may be incorrect, incomplete, or truncated.\n\nProblem:\n\n{problem}\n\n"
)
AGGREGATION_CANDIDATE = "Solution {index}:\n{candidate}\n\n"
AGGREGATION_FOOTER = (
    "Your task is to audit the candidate traces and then synthesize a correct answer to the original problem.\n\n"
    "Follow this process:\n\n"
    "1. Briefly audit each candidate trace. Identify promising strategies, equations, intermediate results, "
    "or final answers that are explicitly supported by the visible text.\n"
    "2. Note any apparent errors or unsupported leaps. If a candidate trace is truncated, use only the claims "
    "that are explicitly supported by the visible text.\n"
    "3. Check the useful ideas for correctness against the original problem. Do not assume a candidate is correct "
    "just because it is confident or because multiple candidates agree.\n"
    "4. After the audit, write a line exactly as follows: ### Final Solution:\n"
    "5. Under that label, synthesize one coherent, self-contained final solution that can be judged without "
    "referring back to the candidates. Combine only the valid parts. If the candidates disagree, resolve the "
    "disagreement by reasoning from the original problem.\n\n"
    "Put the final answer within \\boxed{{}}."
)


def search_prompt(problem: str) -> str:
    """Search Trace Prompt (appendix): the user message from which y_1..y_N1 ~ pi_theta(. | x) are sampled."""
    return SEARCH_TEMPLATE.format(problem=problem)


def aggregation_prompt(problem: str, candidates: list[str]) -> str:
    """Aggregation Trace Prompt (appendix): the user message for y^G_j ~ pi_theta(. | x, G), G = (y_1..y_n).

    The paper shows n = 4 candidates; any n >= 1 gives "Solution 1:" ... "Solution n:" in the same layout.
    Candidates are inserted verbatim (a truncated trace stays truncated: the prompt tells the model so).
    """
    if not candidates:
        raise ValueError("aggregation_prompt needs at least one candidate solution")
    body = "".join(AGGREGATION_CANDIDATE.format(index=i + 1, candidate=c) for i, c in enumerate(candidates))
    return AGGREGATION_HEADER.format(problem=problem) + body + AGGREGATION_FOOTER.format()


# ----------------------------------------------------------------------------------------------------------------------
# 2. Problems


@dataclass
class Problem:
    """One training or evaluation input x with its gold answer (a LaTeX fragment, graded by `reward`)."""

    problem: str
    answer: str
    id: str | None = None


DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BUNDLED = {  # name -> file in data/ (provenance and licenses: data/SOURCES.md)
    "math_train": "math_train.jsonl",
    "aime_1983_2023": "aime_1983_2023.jsonl",
    "math500": "math500.jsonl",
    "aime2024": "aime2024.jsonl",
}
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(:[^:]+)?$")  # "owner/name" or "owner/name:file/in/repo.jsonl"


class ProblemFileError(ValueError):
    """A malformed problem file: the message names the file, the line number and the field."""


class HubUnavailableError(RuntimeError):
    """A Hub dataset could not be fetched (offline, unreachable, or not cached)."""


def load_problems(source: str) -> list[Problem]:
    """Load the problems x (with gold answers) that the training loop draws from (Algorithm 1's inputs B).

    `source` is one of
      - a bundled name: "math_train" (MATH train split, the offline stand-in for POLARIS-53K), "aime_1983_2023",
        "math500", "aime2024" (files in data/, see data/SOURCES.md), or "tiny_sums" (the synthetic task of
        `--preset tiny`, generated in code by `tiny_sum_problems`);
      - a local JSONL file: one object per line with string fields "problem" and "answer" (an integer answer is
        accepted and turned into a string) and optionally "id";
      - a Hugging Face Hub dataset id, e.g. "POLARIS-Project/Polaris-Dataset-53K" (the paper's training set; its one
        file polaris-data-53K.jsonl has "problem", "answer" and "difficulty", of which the first two are used).
        All *.jsonl files of the dataset repository are fetched with huggingface_hub (there must be exactly one;
        otherwise name it as "owner/name:path/in/repo.jsonl"). Parquet-only datasets are not supported (that would
        need pyarrow). With HF_HUB_OFFLINE=1 only the local Hub cache is used.

    Nothing is skipped silently: a line that is not a JSON object, or lacks a non-empty "problem" or "answer", raises
    ProblemFileError naming the file, the line number and the field. Blank lines are allowed. An unreachable Hub
    raises HubUnavailableError (a RuntimeError) that suggests the bundled sets.
    """
    if source in BUNDLED:
        return _read_jsonl(os.path.join(DATA_DIR, BUNDLED[source]))
    if source == "tiny_sums":  # the CPU demo's task, generated in code
        from tiny import tiny_sum_problems
        return tiny_sum_problems()
    if os.path.exists(source):
        return _read_jsonl(source)
    if HUB_ID.match(source) and not source.partition(":")[0].endswith((".jsonl", ".json")):
        return [problem for path in _fetch_from_hub(source) for problem in _read_jsonl(path)]
    raise FileNotFoundError(
        f"problem source {source!r} is not a bundled set ({', '.join([*BUNDLED, 'tiny_sums'])}), an existing file, "
        f"or a Hub dataset id like 'POLARIS-Project/Polaris-Dataset-53K'"
    )


def _read_jsonl(path: str) -> list[Problem]:
    problems = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ProblemFileError(f"{path}, line {line_number}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ProblemFileError(f"{path}, line {line_number}: not a JSON object with 'problem' and 'answer'")
            fields = {}
            for field in ("problem", "answer"):
                value = record.get(field)
                if isinstance(value, int) and not isinstance(value, bool):
                    value = str(value)
                if value is None:
                    raise ProblemFileError(f"{path}, line {line_number}: missing field '{field}'")
                if not isinstance(value, str) or not value.strip():
                    raise ProblemFileError(f"{path}, line {line_number}: field '{field}' must be a non-empty string")
                if not value.isascii() and any("\ud800" <= c <= "\udfff" for c in value):  # JSON "\ud800": not text
                    raise ProblemFileError(f"{path}, line {line_number}: field '{field}' holds an unpaired surrogate")
                fields[field] = value
            problem_id = None if record.get("id") is None else str(record["id"])
            problems.append(Problem(fields["problem"], fields["answer"], problem_id))
    return problems


def _fetch_from_hub(source: str) -> list[str]:
    """Local paths of the JSONL file(s) of Hub dataset `source` ("owner/name" or "owner/name:file")."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download

    repo_id, _, filename = source.partition(":")
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; read it again so that setting it later still counts.
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    try:
        if filename:
            return [hf_hub_download(repo_id, filename, repo_type="dataset", local_files_only=offline)]
        folder = snapshot_download(repo_id, repo_type="dataset", allow_patterns=["*.jsonl"], local_files_only=offline)
    except Exception as e:  # network errors, offline mode, missing cache, unknown or gated repository, ...
        raise HubUnavailableError(
            f"could not fetch Hub dataset {repo_id!r} ({type(e).__name__}{', offline mode' if offline else ''}); "
            f"use a bundled set instead ({', '.join(repr(name) for name in BUNDLED)}) or a local JSONL file"
        ) from e
    paths = sorted(
        os.path.join(root, name) for root, _, names in os.walk(folder) for name in names if name.endswith(".jsonl")
    )
    if len(paths) != 1:
        found = [os.path.relpath(p, folder) for p in paths]
        raise ValueError(f"Hub dataset {repo_id!r} has {len(paths)} JSONL files {found}; name one as '{repo_id}:FILE'")
    return paths


# ----------------------------------------------------------------------------------------------------------------------
# 3. Policies


def check_model(name: str) -> None:
    """Fail fast, with a one-line ValueError, on a model that load_policy cannot load: a directory without
    config.json, or a Hub id that is neither cached nor on a reachable Hub (instead of ~50 s of retries)."""
    local = os.path.expanduser(name)
    if name == "tiny" or os.path.isfile(os.path.join(local, "config.json")):
        return
    if os.path.isdir(local):
        raise ValueError("no config.json, so not a model directory")
    if name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") > 1:
        raise ValueError("no such directory")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        raise ValueError(f"unknown model; expected 'tiny', a local directory or a Hugging Face id like {DEFAULT_MODEL}")
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    cached = isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    if huggingface_hub.constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES",
                                                                                                      "TRUE"):
        if not cached:
            raise ValueError("not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
        return
    try:
        huggingface_hub.model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise ValueError("not on the Hugging Face Hub (or private: log in with `hf auth login`)") from None
    except Exception as e:  # no network: DNS, proxy, timeout, ...
        if not cached:
            raise ValueError(f"the Hugging Face Hub is unreachable ({type(e).__name__}) and the model is not in the "
                             "local cache") from None
        huggingface_hub.constants.HF_HUB_OFFLINE = True  # else each file's download retries for tens of seconds
        os.environ["HF_HUB_OFFLINE"] = "1"
        print(f"the Hugging Face Hub is unreachable; loading {name} from the local cache")


@dataclass
class Completion:
    """One sampled completion y ~ pi(. | prompt); the unit that rollout hands to spiral.py."""

    prompt_ids: list[int]  # chat-templated prompt, no padding
    completion_ids: list[int]  # sampled tokens, up to and including the EOS that ended it
    logprobs: list[float]  # log pi_sampler(token) at the sampling temperature, one per completion token
    text: str  # decoded completion, special tokens removed
    truncated: bool  # hit max_new_tokens without an EOS


def load_policy(name_or_path: str = DEFAULT_MODEL, device: str | None = None):
    """Return (model, tokenizer) for the policy pi_theta: a Hugging Face model id, a local directory, or "tiny".

    On a GPU the model is loaded in bf16 with sdpa attention; on CPU in float32. "tiny" is built in code and is
    deterministic (same weights every call), which is what the tests and `--preset tiny` use.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name_or_path == "tiny":
        from tiny import load_tiny_policy  # imported here: tiny.py imports this module
        return load_tiny_policy(device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), tokenizer


# ----------------------------------------------------------------------------------------------------------------------
# 4. Sampling: y ~ pi_theta(. | x) (Algorithm 1, lines 2 and 7)

# Default micro-batch: as many sequences as fit this many (prompt + completion) tokens in one generate call.
# For Qwen3-4B in bf16 the KV cache costs 144 KiB per token (36 layers x K,V x 8 heads x 128 dims x 2 bytes), so
# 131,072 tokens are 18 GiB: about 25 search traces (1024 + 4096 tokens) or 6 aggregation traces (~17k + 4096).
DEFAULT_TOKENS_PER_MICRO_BATCH = 131_072


def chat_prompt_ids(tokenizer, user_message: str) -> list[int]:
    """Token ids of the chat-templated prompt x for one user message, ending with the assistant header."""
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: model.generation_config.eos_token_id (an int or a list) plus the tokenizer's.

    Qwen3 stops on both <|im_end|> and <|endoftext|>; the latter is also its pad token.
    """
    configured = model.generation_config.eos_token_id
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model defines no EOS token (generation_config.eos_token_id and tokenizer.eos_token_id)")
    return ids


def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    progress: bool = False,
    share_prefix: bool = True,
) -> list[list[Completion]]:
    """Sample `samples_per_prompt` completions y ~ pi_theta(. | x) for each prompt x (Algorithm 1, lines 2 and 7).

    `prompts` are user messages (e.g. `search_prompt(...)`); the chat template is applied here. Returns one list of
    `samples_per_prompt` Completions per prompt, in the order of `prompts`.

    Sampling is plain temperature sampling from the full softmax, softmax(logits / temperature): top-k, top-p,
    min-p and repetition penalty are off whatever model.generation_config says. Each Completion's `logprobs` are
    log softmax(logits / temperature) of the sampled tokens, recorded while sampling from exactly those scores.
    A completion is cut by position, after its first EOS (any of `eos_token_ids`); `truncated` means that no EOS
    came within max_new_tokens.

    Batching: left-padded batches with an attention mask, at most `micro_batch_size` sequences per `generate`
    call (default: as many as fit DEFAULT_TOKENS_PER_MICRO_BATCH tokens). Prompts are grouped by length to waste
    little compute on padding.

    share_prefix: the copies of one prompt in a call share one prefill. The prompts (all but their last token) are
    run through the model once, the KV cache is repeated along the batch (`DynamicCache.batch_repeat_interleave`,
    public in transformers 5.x) and `generate` continues from it. Without this, `generate` prefills every copy
    (its `num_return_sequences` also repeats the input before the prefill). For the paper's aggregation step
    (prompts of up to ~17k tokens, N2 = 4 samples each) this saves 3 of every 4 prefills, i.e. 3/4 of the prefill
    FLOPs; decoding costs the same. It saves no memory: every copy still gets its own copy of the cache (sharing
    that memory needs a paged KV cache, as in vLLM, which HF `generate` does not have). Measured on CPU (tiny
    policy, one thread, median of 3): a 3,066-token aggregation prompt, 4 samples of 16 tokens: 2.52 s without,
    0.85 s with. If a model's cache cannot be repeated, the call falls back to a prefill per copy.
    """
    if samples_per_prompt < 1 or max_new_tokens < 1 or not temperature > 0:
        raise ValueError("need samples_per_prompt >= 1, max_new_tokens >= 1 and temperature > 0")
    prompt_ids_P = [chat_prompt_ids(tokenizer, prompt) for prompt in prompts]
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]  # only fills the left
    if micro_batch_size is None:
        longest = max((len(ids) for ids in prompt_ids_P), default=0)
        micro_batch_size = max(1, DEFAULT_TOKENS_PER_MICRO_BATCH // (longest + max_new_tokens))
    calls = _plan_micro_batches([len(ids) for ids in prompt_ids_P], samples_per_prompt, micro_batch_size)
    if progress:
        from tqdm.auto import tqdm

        calls = tqdm(calls, desc="generate", unit="batch")

    completions_P: list[list[Completion]] = [[] for _ in prompts]
    was_training = model.training
    model.eval()  # no dropout while sampling; and gradient checkpointing in train mode would turn the KV cache off
    try:
        for prompt_indices, copies in calls:
            completion_ids_B, logprobs_B = _sample_micro_batch(
                model, [prompt_ids_P[i] for i in prompt_indices], copies, max_new_tokens, temperature, eos_ids, pad_id,
                share_prefix,
            )
            rows_of_prompt = [i for i in prompt_indices for _ in range(copies)]  # same order as repeat_interleave
            for i, token_ids, token_logprobs in zip(rows_of_prompt, completion_ids_B, logprobs_B):
                completion_ids, truncated = cut_at_first_eos(token_ids, eos_ids)
                completions_P[i].append(
                    Completion(
                        prompt_ids=list(prompt_ids_P[i]),
                        completion_ids=completion_ids,
                        logprobs=token_logprobs[: len(completion_ids)],
                        text=tokenizer.decode(completion_ids, skip_special_tokens=True),
                        truncated=truncated,
                    )
                )
    finally:
        model.train(was_training)
    return completions_P


def cut_at_first_eos(token_ids: list[int], eos_ids) -> tuple[list[int], bool]:
    """(tokens up to and including the first EOS, truncated): by position, never by comparing with the pad id.

    After a sequence ends, `generate` fills its row with the pad id, which for Qwen3 is itself an EOS id; cutting at
    the first EOS keeps the real stop token (which the loss must train) and drops the filler.
    """
    eos_ids = set(eos_ids)
    for position, token in enumerate(token_ids):
        if token in eos_ids:
            return list(token_ids[: position + 1]), False
    return list(token_ids), True


def _plan_micro_batches(prompt_lengths: list[int], samples_per_prompt: int, micro_batch_size: int):
    """Split the (prompt, sample) pairs into generate calls of at most `micro_batch_size` sequences.

    Returns a list of (prompt indices, copies): each prompt of a call is sampled `copies` times in it, so that one
    prefill per prompt can be shared. Prompts are taken shortest first, so a call holds prompts of similar length.
    """
    order = sorted(range(len(prompt_lengths)), key=lambda i: prompt_lengths[i])
    if samples_per_prompt <= micro_batch_size:
        per_call = micro_batch_size // samples_per_prompt
        return [(order[start : start + per_call], samples_per_prompt) for start in range(0, len(order), per_call)]
    return [
        ([i], min(micro_batch_size, samples_per_prompt - start))
        for i in order
        for start in range(0, samples_per_prompt, micro_batch_size)
    ]


class SamplerLogprobs(LogitsProcessor):
    """Divides the logits by the temperature and records log pi(y_t) of each sampled token, in fp32.

    Hugging Face calls its logits processors at every step with (input_ids, scores). Custom processors run after
    the built-in ones and before the sampling warpers (temperature, top-k, top-p, min-p: all switched off by
    `_plain_sampling_config`), so the scores returned here are exactly what `generate` samples from:
    softmax(logits / T). The token sampled from them is only known at the next call (the last column of
    input_ids) or, for the final step, from the returned sequences (`finish`). So only one (B, V) row of
    log-probabilities is kept, not one per step as `output_scores=True` would (for Qwen3's 151,936-token vocabulary,
    64 sequences x 4,096 steps of fp32 scores would be 159 GB).
    """

    def __init__(self, temperature: float, prompt_length: int):
        self.temperature = temperature
        self.prompt_length = prompt_length
        self.logprobs: list[torch.Tensor] = []  # one (B,) tensor per generated position
        self._pending: torch.Tensor | None = None  # (B, V) log-probs of the token being sampled now
        self._pending_position = -1  # its position in the sequence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        self._record(input_ids)
        scores = scores.float() / self.temperature  # (B, V)
        self._pending = torch.log_softmax(scores, dim=-1)  # (B, V)
        self._pending_position = input_ids.shape[1]
        return scores

    def _record(self, sequences: torch.LongTensor) -> None:
        """Keep log pi(token) for the pending position if `sequences` (B, T) already holds the sampled token."""
        if self._pending is not None and sequences.shape[1] > self._pending_position:
            assert self._pending_position == self.prompt_length + len(self.logprobs), "a generate step was skipped"
            token_B = sequences[:, self._pending_position]  # (B,)
            self.logprobs.append(self._pending.gather(1, token_B[:, None]).squeeze(1))
        self._pending = None

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """(B, T_new) log-probs of the generated tokens of `sequences` (B, prompt_length + T_new)."""
        self._record(sequences)
        num_new = sequences.shape[1] - self.prompt_length
        if num_new == 0:
            return sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float32)
        # A step beyond the returned sequences (transformers may run one and undo it) is dropped here.
        return torch.stack(self.logprobs[:num_new], dim=1)  # (B, T_new)


def _plain_sampling_config(max_new_tokens: int, eos_ids: list[int], pad_id: int) -> GenerationConfig:
    """Multinomial sampling from the scores our processor returns: every warper and penalty neutral.

    temperature=1.0 because SamplerLogprobs applies the real temperature; top_k=0 (not None: None would be filled
    in from the model's generation_config and then from transformers' default top_k=50).
    """
    return GenerationConfig(
        do_sample=True,
        num_beams=1,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        typical_p=1.0,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        use_cache=True,
    )


@contextmanager
def _bare_generation_defaults(model, eos_ids: list[int], pad_id: int):
    """Hide the model's own generation_config from `generate` for the duration of one call.

    `generate` fills every field our config leaves at None (min_p, top_h, suppress_tokens, sequence_bias,
    cache_implementation, ...) from model.generation_config, which for a Hub model is generation_config.json.
    A bare config with only the special tokens leaves those fields neutral.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        bos_token_id=saved.bos_token_id, eos_token_id=eos_ids, pad_token_id=pad_id
    )
    try:
        yield
    finally:
        model.generation_config = saved


def _left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (P, L): each row right-aligned, pads on the left with mask 0."""
    length = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)  # (P, L)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)  # (P, L)
    for row, s in enumerate(sequences):
        input_ids[row, length - len(s) :] = torch.tensor(s, dtype=torch.long)
        attention_mask[row, length - len(s) :] = 1
    return input_ids.to(device), attention_mask.to(device)


@torch.no_grad()  # generate() is no_grad, this prefill must be too: LoRA weights require grad in training
def _prefill_shared_prefix(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int):
    """KV cache of every prompt but its last token, computed once and repeated `copies` times along the batch.

    `generate` then sees a cache of length L - 1 with inputs of length L and runs only the last prompt token
    (it needs that step's logits for the first sampled token). Returns None if the cache cannot be repeated.
    """
    prefix_mask = attention_mask[:, :-1]  # (P, L-1)
    position_ids = (prefix_mask.cumsum(-1) - 1).clamp(min=0)  # (P, L-1), as generate builds them from the mask
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    outputs = model(  # logits_to_keep=1: no lm_head over the whole prompt
        input_ids=input_ids[:, :-1], attention_mask=prefix_mask, position_ids=position_ids, use_cache=True, **extra
    )
    cache = outputs.past_key_values
    try:
        cache.batch_repeat_interleave(copies)  # (P, ...) -> (P * copies, ...), rows p0, p0, ..., p1, p1, ...
    except (AttributeError, NotImplementedError):
        return None
    return cache


def _sample_micro_batch(model, prompt_ids, copies, max_new_tokens, temperature, eos_ids, pad_id, share_prefix):
    """One `generate` call: `copies` samples of each prompt. Returns (token ids, log-probs) per row, unpadded
    on the left and not yet cut at EOS; rows are ordered prompt by prompt."""
    input_ids, attention_mask = _left_pad(prompt_ids, pad_id, model.device)  # (P, L)
    prompt_length = input_ids.shape[1]
    extra = {}
    if share_prefix and copies > 1 and prompt_length > 1:
        cache = _prefill_shared_prefix(model, input_ids, attention_mask, copies)
        if cache is not None:
            extra["past_key_values"] = cache
    input_ids = input_ids.repeat_interleave(copies, dim=0)  # (B, L), B = P * copies
    attention_mask = attention_mask.repeat_interleave(copies, dim=0)  # (B, L)
    recorder = SamplerLogprobs(temperature, prompt_length)
    with _bare_generation_defaults(model, eos_ids, pad_id):
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=_plain_sampling_config(max_new_tokens, eos_ids, pad_id),
            logits_processor=LogitsProcessorList([recorder]),
            **extra,
        )  # (B, L + T)
    logprobs = recorder.finish(sequences)  # (B, T)
    return sequences[:, prompt_length:].tolist(), logprobs.tolist()
