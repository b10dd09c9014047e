"""transformers' greedy tokens for a list of prompts: the reference several runs compare to."""


def hf_greedy_outputs(model, prompts, max_new):
  """Generated token ids (prompt excluded) of `model` (an HF causal LM) for each prompt, greedy,
  with max_new[i] new tokens at most and eos id 2."""
  import torch
  out = []
  for ids, m in zip(prompts, max_new):
    with torch.no_grad():
      out.append(model.generate(torch.tensor([ids]), max_new_tokens=m, do_sample=False,
                                eos_token_id=2, pad_token_id=0)[0, len(ids):].tolist())
  return out
