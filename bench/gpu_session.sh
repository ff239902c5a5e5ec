#!/usr/bin/env bash
# One device call: everything the GPU issues need, each part bounded, logs + JSON under $OUT.
#   bash bench/gpu_session.sh PART...   parts: env bench350 bench350c bench1b benchf tests smoke memhead isotests telemetry calib scale
#                                       family qwen05 qwen15 lora
#                                       long32k (long8k long16k long64k) fp8 fsdp2 longtests i19tests   (issue 19)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD/src
export TORCH_EXTENSIONS_DIR=/tmp/torch_ext TORCH_CUDA_ARCH_LIST=9.0
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD/src:/tmp/site
fi
for part in "$@"; do
  echo "=== $part $(date +%T)"
  case $part in
    env) nvidia-smi --query-gpu=name,memory.total,clocks.sm,utilization.gpu --format=csv
         python3 -c "import torch,transformers;print(torch.__version__,transformers.__version__,torch.cuda.get_device_name(0))";;
    bench350) timeout 200 python3 bench/gpu_bench.py --model 350m --steps 25 --warmup 6 \
                --out $OUT/gpu_bench_350m.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/bench350.log | tail -40;;
    bench350c) timeout 300 python3 bench/gpu_bench.py --model 350m --data corpus --variants aef --steps 30 --warmup 6 \
                --out $OUT/gpu_bench_350m_corpus.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tail -12;;
    bench1b) timeout 220 python3 bench/gpu_bench.py --model 1b --steps 20 --warmup 6 \
                --out $OUT/gpu_bench_1b.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/bench1b.log | tail -14;;
    benchf) timeout 300 python3 bench/gpu_bench.py --model ${M:-350m} --variants f --steps 30 --warmup 6 \
                --out $OUT/gpu_bench_f.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tail -6;;
    tests) timeout 130 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "isolation or 350m" 2>&1 | tee $OUT/gpu_tests.log | tail -15;;
    smoke) timeout 300 python3 bench/train_gpu_smoke.py $OUT/train_gpu_smoke.json --steps 20 2>&1 | tail -25;;
    memhead) timeout 420 python3 bench/memory_headline.py $OUT/memory_headline_350m.json --steps 14 2>&1 | grep -v Warning | tail -12;;
    isotests) timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu -k isolation 2>&1 | tail -6;;
    telemetry)
      python3 -c "from packtrain.train.synthetic import make_synthetic_inputs as m; m('/tmp/tw', n_docs=6000, vocab_size=32768, budget=2048)"
      MLFLOW_TRACKING_URI=http://127.0.0.1:9 timeout 200 python3 -m packtrain.cli train --recipe 350m-h200 \
        --packs /tmp/tw/pack --tokens /tmp/tw/tokenize --out /tmp/tw/train --set workdir=/tmp/tw \
        --set train.max_steps=150 --set train.loss=fused --set telemetry.interval_s=0.2 \
        --set tracking.buffer_dir=/tmp/tw/mlbuf 2>&1 | grep -v Warning | tail -5
      tar czf $OUT/telemetry_350m.tgz -C /tmp/tw mlbuf train/telemetry.json train/train_result.json \
        $(cd /tmp/tw && ls train/*.png 2>/dev/null);;
    scale) timeout ${SCALE_TIMEOUT:-540} python3 bench/scaling.py $OUT/scaling_${SCALE_NAME:-1b_h200x2}.json --gpus ${GPUS:-2} \
             --configs ${CONFIGS:-zero2,zero3} --steps ${SCALE_STEPS:-20} --warmup 6 --timeout ${RUN_TIMEOUT:-200} 2>&1 \
             | grep -v Warning | tee $OUT/scaling.log | tail -30;;
    family) timeout 300 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_family_varlen.py 2>&1 \
              | tee $OUT/gpu_family_tests.log | tail -25;;
    qwen05) timeout 330 python3 bench/gpu_bench.py --model qwen2-0.5b --variants ef --loss fused --steps 20 --warmup 6 \
              --out $OUT/gpu_bench_qwen2_0.5b.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/qwen05.log | tail -14;;
    qwen15) timeout 420 python3 bench/gpu_bench.py --model qwen2-1.5b --variants ef --loss fused --steps 20 --warmup 6 \
              --out $OUT/gpu_bench_qwen2_1.5b.json ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/qwen15.log | tail -14;;
    lora) timeout ${LORA_TIMEOUT:-480} python3 bench/lora_bench.py --steps ${LORA_STEPS:-10} --warmup ${LORA_WARMUP:-4} \
            --out-dir $OUT ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/lora_bench.log | tail -16;;
    long8k|long16k|long32k|long64k)   # issue 19: 1B at a long budget, packtrain beside transformers (~2-3 min)
      k=${part#long}; k=${k%k}
      timeout ${LONG_TIMEOUT:-330} python3 bench/long_context_bench.py --budget $((k * 1024)) \
        --out $OUT/long_context_1b_${k}k.json ${LONG_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/long${k}k.log | tail -8;;
    fp8) timeout ${FP8_TIMEOUT:-540} python3 bench/fp8_bench.py --out $OUT/fp8_bench_3b.json ${FP8_ARGS:-} 2>&1 \
           | grep -v Warning | tee $OUT/fp8.log | tail -8;;    # issue 19: 3B bf16 vs fp8, 2 × 200 steps (~6 min)
    fsdp2) timeout ${FSDP2_TIMEOUT:-360} python3 bench/fsdp2_bench.py --out $OUT/fsdp2_bench_1b.json ${FSDP2_ARGS:-} 2>&1 \
             | grep -v Warning | tee $OUT/fsdp2.log | tail -8;;  # issue 19: 1B torch vs fsdp2 (+ torch again) (~3-4 min)
    longtests) timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_long_context_gpu.py 2>&1 \
                 | tee $OUT/long_context_gpu_tests.log | tail -15;;   # issue 19 (A): continue chunks isolated, ~1-2 min
    i19tests) timeout 300 python3 -m pytest -q -s -p no:cacheprovider $(ls tests/gpu/test_long_context_gpu.py \
                tests/gpu/test_fp8_gpu.py 2>/dev/null) 2>&1 | tee $OUT/issue19_gpu_tests.log | tail -15;;   # A's + B's GPU tests
    calib) timeout 130 python3 bench/memory_calibration.py $OUT/memory_plan_calibration.json --max-seconds 250 2>&1 | tail -20;;
    *) echo "unknown part $part";;
  esac
done
echo "=== done $(date +%T)"
