"""A zoo of real architectures at small sizes: Hugging Face models built from a config (random weights, nothing
downloaded) and ``torch.nn`` modules. Each builder returns ``(model, make_batch, loss_fn)`` as in ``models.py``;
``make_batch(seed)`` gives ``(inputs, targets)`` and the loss comes from ``loss_fn(model(**inputs), targets)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

B, T, V, H = 8, 32, 64, 32  # batch, sequence, vocabulary, width


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _text(cls_name: str, cfg_name: str, labels: str = "lm", **cfg):
    def build():
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config)

        def make_batch(seed: int):
            g = _gen(seed)
            ids = torch.randint(1, V, (B, T), generator=g)
            inputs = {"input_ids": ids, "attention_mask": torch.ones(B, T, dtype=torch.long)}
            if labels == "lm":
                inputs["labels"] = ids
            elif labels == "cls":
                inputs["labels"] = torch.randint(0, 2, (B,), generator=g)
            elif labels == "seq2seq":
                inputs["labels"] = torch.randint(1, V, (B, T // 2), generator=g)
            return inputs, None

        return model, make_batch, lambda out, _: out.loss

    build.__name__ = cls_name
    return build


_SMALL = {"vocab_size": V, "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 2,
          "intermediate_size": 64, "max_position_embeddings": 64}
_DECODER = {**_SMALL, "num_key_value_heads": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "use_cache": False}

bert = _text("BertForSequenceClassification", "BertConfig", "cls", **_SMALL)
roberta = _text("RobertaForMaskedLM", "RobertaConfig", **{**_SMALL, "pad_token_id": 0})
distilbert = _text("DistilBertForSequenceClassification", "DistilBertConfig", "cls", vocab_size=V, dim=H,
                   n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)
gpt2 = _text("GPT2LMHeadModel", "GPT2Config", vocab_size=V, n_positions=64, n_embd=H, n_layer=2, n_head=2,
             n_inner=64, use_cache=False, bos_token_id=1, eos_token_id=2)
llama = _text("LlamaForCausalLM", "LlamaConfig", **_DECODER)
qwen2 = _text("Qwen2ForCausalLM", "Qwen2Config", **_DECODER)
mistral = _text("MistralForCausalLM", "MistralConfig", **_DECODER)
mixtral = _text("MixtralForCausalLM", "MixtralConfig", **_DECODER, num_local_experts=4, num_experts_per_tok=2)
t5 = _text("T5ForConditionalGeneration", "T5Config", "seq2seq", vocab_size=V, d_model=H, d_kv=16, d_ff=64,
           num_layers=2, num_heads=2, decoder_start_token_id=0, pad_token_id=0)
bart = _text("BartForConditionalGeneration", "BartConfig", "seq2seq", vocab_size=V, d_model=H, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             decoder_start_token_id=2, forced_eos_token_id=None)


def _image(cls_name: str, cfg_name: str, size: int = 32, **cfg):
    def build():
        import transformers

        model = getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg))

        def make_batch(seed: int):
            g = _gen(seed)
            return ({"pixel_values": torch.randn(B, 3, size, size, generator=g),
                     "labels": torch.randint(0, 3, (B,), generator=g)}, None)

        return model, make_batch, lambda out, _: out.loss

    build.__name__ = cls_name
    return build


vit = _image("ViTForImageClassification", "ViTConfig", image_size=32, patch_size=8, hidden_size=H,
             num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=3)
convnext = _image("ConvNextForImageClassification", "ConvNextConfig", hidden_sizes=[16, 32], depths=[1, 1],
                  num_stages=2, num_labels=3)
swin = _image("SwinForImageClassification", "SwinConfig", image_size=32, patch_size=4, embed_dim=16,
              depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)
resnet = _image("ResNetForImageClassification", "ResNetConfig", embedding_size=8, hidden_sizes=[16, 16],
                depths=[1, 1], layer_type="basic", num_labels=3)


def whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(vocab_size=V, num_mel_bins=16, d_model=H, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False)
    model = WhisperForConditionalGeneration(cfg)

    def make_batch(seed: int):
        g = _gen(seed)
        return ({"input_features": torch.randn(B, 16, 32, generator=g),
                 "labels": torch.randint(3, V, (B, 8), generator=g)}, None)

    return model, make_batch, lambda out, _: out.loss


def clip():
    from transformers import CLIPConfig, CLIPModel

    text = {"vocab_size": V, "hidden_size": H, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 32}
    vision = {"hidden_size": H, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))

    def make_batch(seed: int):
        g = _gen(seed)
        return ({"input_ids": torch.randint(1, V, (B, T), generator=g),
                 "pixel_values": torch.randn(B, 3, 32, 32, generator=g), "return_loss": True}, None)

    return model, make_batch, lambda out, _: out.loss


def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(4, 4), conv_kernel=(8, 4),
                         num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, pad_token_id=0,
                         mask_time_prob=0.0, ctc_loss_reduction="mean")
    model = Wav2Vec2ForCTC(cfg)

    def make_batch(seed: int):
        g = _gen(seed)
        return ({"input_values": torch.randn(B, 800, generator=g),
                 "labels": torch.randint(1, V, (B, 6), generator=g)}, None)

    return model, make_batch, lambda out, _: out.loss


class _Seq(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.rnn = rnn
        self.head = nn.Linear(H, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.rnn(self.emb(ids))
        return self.head(out[0] if isinstance(out, tuple) else out)


def _seq(name: str, make):
    def build():
        model = _Seq(make())

        def make_batch(seed: int):
            ids = torch.randint(0, V, (B, T), generator=_gen(seed))
            return {"ids": ids}, ids

        return model, make_batch, lambda out, ids: F.cross_entropy(out.reshape(-1, V), ids.reshape(-1))

    build.__name__ = name
    return build


nn_lstm = _seq("nn_lstm", lambda: nn.LSTM(H, H, num_layers=2, batch_first=True))
nn_gru = _seq("nn_gru", lambda: nn.GRU(H, H, num_layers=2, batch_first=True))
nn_transformer = _seq("nn_transformer", lambda: nn.TransformerEncoder(
    nn.TransformerEncoderLayer(H, 2, 64, dropout=0.1, batch_first=True), num_layers=2, enable_nested_tensor=False))


class _SDPABlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(H, 3 * H)
        self.out = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, T, 3, 2, H // 2).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(B, T, H))


nn_sdpa = _seq("nn_sdpa", lambda: nn.Sequential(_SDPABlock(), _SDPABlock()))

ZOO = {f.__name__: f for f in (bert, roberta, distilbert, gpt2, llama, qwen2, mistral, mixtral, t5, bart, vit,
                                convnext, swin, resnet, whisper, clip, wav2vec2, nn_lstm, nn_gru, nn_transformer,
                                nn_sdpa)}
