import os, sys, torch
sys.path.insert(0, "tests/gpu")
from megatron_common import QWEN2_05B, make_groups, make_hf_dir
from slime.config import MegatronConfig, TrainConfig
from slime.train.megatron.trainer import MegatronTrainer
d = make_hf_dir("/tmp/slime_gpu/qwen2_05b", QWEN2_05B)
groups = make_groups(vocab_size=QWEN2_05B["vocab_size"], num_groups=2, group_size=8, prompt_len=512, response_len=3584, ragged=False)
cfg = TrainConfig(train_backend="megatron", global_batch_size=16, micro_batch_size=1, lr=1e-6, max_staleness=1 << 30,
                  megatron=MegatronConfig(bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=16384))
t = MegatronTrainer(cfg, model_dir=d)
t.train_step(groups); torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t.train_step(groups); torch.cuda.synchronize()
tab = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70)
print(tab)
open(os.path.join(os.environ["OUT"], "profile.txt"), "w").write(tab)
