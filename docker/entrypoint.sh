#!/bin/sh
# Entrypoint of the pagellm images (docker/Dockerfile, docker/Dockerfile.cpu).
#
#   docker run IMAGE [FLAGS...]                runs `pagellm serve [FLAGS...]`
#   docker run IMAGE serve [FLAGS...]          the same
#   docker run IMAGE --version                 runs `pagellm --version`
#   docker run IMAGE pagellm inspect --model /models    any other command runs as given
#
# Every `pagellm serve` option is a flag or an environment variable (PAGELLM_MAX_NUM_SEQS=64 is
# --max-num-seqs 64) or a key of the --config file; pagellm reads all three itself, the command
# line first, then the environment, then the file. This script only adds what a container needs
# when none of the three sets it:
#   - host: 0.0.0.0 (pagellm's own default, 127.0.0.1, is unreachable from outside a container);
#   - device: $PAGELLM_IMAGE_DEVICE (cuda in the CUDA image, cpu in the CPU one);
#   - config: /etc/pagellm/config.yaml when that file exists (where the Kubernetes manifests mount
#     their ConfigMap);
#   - model: /models, the folder to mount the model on (read-only).
# It refuses to start, saying how to fix it, when the model path or the config file does not exist,
# or when the model path is a folder with neither config.json nor a .gguf file. Then it replaces
# itself with pagellm (exec): the server gets SIGTERM from `docker stop` or the kubelet, drains the
# requests in flight (--drain-timeout) and exits 0.
set -eu

default_model=/models
default_config=/etc/pagellm/config.yaml

die() {
  printf 'pagellm-entrypoint: %s\n' "$*" >&2
  exit 2
}

case "${1-}" in
  '' | -*) ;;
  serve) shift ;;
  pagellm)
    if [ "${2-}" != serve ]; then exec "$@"; fi
    shift 2
    ;;
  *) exec "$@" ;;
esac
for a in "$@"; do
  case "$a" in
    --version) exec pagellm --version ;;
    --help | -h) exec pagellm serve "$@" ;;
  esac
done

# arg_value NAME ARGS...: prints the value given to --NAME on the command line (--NAME V or
# --NAME=V); returns 1 when the flag is absent.
arg_value() {
  name=$1
  shift
  found=1
  take=0
  for a in "$@"; do
    if [ "$take" = 1 ]; then
      value=$a
      found=0
      take=0
      continue
    fi
    case "$a" in
      "--$name") take=1 ;;
      "--$name="*)
        value=${a#"--$name="}
        found=0
        ;;
    esac
  done
  [ "$found" = 0 ] && printf '%s\n' "$value"
  return "$found"
}

# env_value NAME: prints $PAGELLM_<NAME> (--max-num-seqs -> PAGELLM_MAX_NUM_SEQS); returns 1 when
# it is unset or empty.
env_value() {
  var=PAGELLM_$(printf '%s' "$1" | tr 'a-z-' 'A-Z_')
  eval "value=\${$var-}"
  [ -n "$value" ] && printf '%s\n' "$value"
}

# config_value NAME FILE: prints the top-level key NAME of a YAML (`name: value`) or JSON
# (`"name": "value"`) config file when its value is a plain scalar; returns 1 when the file has no
# such key. A value this simple reader cannot read prints nothing but still returns 0.
config_value() {
  [ -n "$2" ] && [ -f "$2" ] || return 1
  line=$(grep -m 1 -E "^$1:|\"$1\"[[:space:]]*:" "$2") || return 1
  case "$line" in
    "$1:"*)
      printf '%s\n' "${line#"$1:"}" | sed -e 's/[[:space:]]#.*$//' -e 's/^[[:space:]]*//' \
        -e 's/[[:space:]]*$//' -e 's/^"\(.*\)"$/\1/' -e "s/^'\\(.*\\)'\$/\\1/"
      ;;
    *) printf '%s\n' "$line" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" ;;
  esac
  return 0
}

# is_set NAME ARGS...: whether the command line, the environment or the config file sets NAME.
is_set() {
  name=$1
  shift
  arg_value "$name" "$@" >/dev/null || env_value "$name" >/dev/null ||
    config_value "$name" "$config" >/dev/null
}

config=$(arg_value config "$@") || config=$(env_value config) || config=
if [ -z "$config" ] && [ -f "$default_config" ]; then
  config=$default_config
  set -- --config "$config" "$@"
fi
if [ -n "$config" ] && [ ! -f "$config" ]; then
  die "config file '$config' does not exist in the container (mount it, e.g. docker run -v \$PWD/pagellm.yaml:$default_config:ro, or a ConfigMap at $default_config)"
fi

if ! is_set host "$@"; then
  export PAGELLM_HOST=0.0.0.0
fi
if [ -n "${PAGELLM_IMAGE_DEVICE-}" ] && ! is_set device "$@"; then
  export PAGELLM_DEVICE="$PAGELLM_IMAGE_DEVICE"
fi

if ! model=$(arg_value model "$@") && ! model=$(env_value model); then
  if ! model=$(config_value model "$config"); then
    model=$default_model
    export PAGELLM_MODEL="$model"
  fi
fi
if [ -n "$model" ]; then
  if [ ! -e "$model" ]; then
    die "model path '$model' does not exist in the container. Mount the model read-only there (docker run -v /srv/models/NAME:$default_model:ro ...; on Kubernetes a read-only volume at $default_model) or point --model / PAGELLM_MODEL at it"
  fi
  if [ -d "$model" ]; then
    has_weights=0
    [ -f "$model/config.json" ] && has_weights=1
    for f in "$model"/*.gguf; do
      [ -f "$f" ] && has_weights=1
    done
    if [ "$has_weights" = 0 ]; then
      die "model folder '$model' has neither config.json nor a .gguf file: mount the model's own folder (config.json, *.safetensors, tokenizer.json), or point --model at the .gguf file"
    fi
  fi
fi

exec pagellm serve "$@"
