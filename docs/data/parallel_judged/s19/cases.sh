cd /work/main
export PYTHONPATH=$PWD EQSAT_DATA=/work/shared/data XLA_FLAGS=--xla_force_host_platform_device_count=8
for c in unity-mlp mlp16 gpt-block gpt12 dlrm mlp-bottleneck cnn moe; do
  for extra in "" "--calibrated"; do
    .venv/bin/eqsat parallel $c --mesh 2x4 --json $extra > /work/wt/s19/cases/$c${extra}.json 2>/work/wt/s19/cases/$c${extra}.err
  done
done
echo done > /work/wt/s19/cases/DONE
