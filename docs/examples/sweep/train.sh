# One task of the sweep: $1 is its learning rate. Resumes from ckpt/step when a checkpoint was
# carried in (the task's earlier attempt ran on a provider that went away).
lr=$1
mkdir -p ckpt out
step=0
if [ -f ckpt/step ]; then step=$(cat ckpt/step); fi
echo "task $TASK_INDEX of $TASK_COUNT: lr=$lr, from step $step"
while [ "$step" -lt "$STEPS" ]; do
  sleep 1
  step=$((step + 1))
  echo "$step" > ckpt/step.new && mv ckpt/step.new ckpt/step
done
echo "{\"task\": $TASK_INDEX, \"lr\": \"$lr\", \"steps\": $step}" > out/metrics.json
sha256sum out/metrics.json > out/metrics.sha256
echo "task $TASK_INDEX done"
