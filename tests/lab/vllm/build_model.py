"""Build the real-vLLM tier's model: a tiny random-weight Llama and a locally trained tokenizer.

Run with the tier's venv python (transformers, tokenizers, torch): `python build_model.py OUT_DIR`.
Nothing is downloaded (HF_HUB_OFFLINE=1); the output is deterministic for a given seed and the
pinned library versions. Its text is random; clients send `"ignore_eos": true` for fixed lengths.
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

VOCAB = 2048
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu "
         "the a of to and in is it that for on with as at by from this be are was were have has "
         "request engine scheduler token stream worker model server hang wedge decode prefill "
         "user assistant system hello please answer question round agent").split()


def corpus(n=4000):
    import random

    rng = random.Random(1234)
    for i in range(n):
        k = rng.randint(4, 24)
        yield " ".join(rng.choice(WORDS) for _ in range(k)) + f" {i} " + "".join(
            chr(rng.randint(33, 126)) for _ in range(rng.randint(0, 12)))


def build(out):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1024
    fast.save_pretrained(out)

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=1024, bos_token_id=fast.bos_token_id,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # The chat template also in tokenizer_config.json (save_pretrained may keep it in a
    # separate chat_template.jinja, which older loaders ignore).
    p = os.path.join(out, "tokenizer_config.json")
    with open(p) as f:
        tc = json.load(f)
    tc["chat_template"] = CHAT_TEMPLATE
    with open(p, "w") as f:
        json.dump(tc, f, indent=1)


if __name__ == "__main__":
    build(sys.argv[1])
