//! Shell completion from the server, as kubectl completes from the API server: a
//! resource type where `get`, `describe`, `count` and `watch` take one, and a cluster
//! name after `--cluster`. The bash script (`fleetscope completion bash`) is clap's,
//! with a function in front that asks `fleetscope __complete resources|clusters` (with
//! the server flags of the line being completed) and falls back to clap's for the rest;
//! a server that does not answer within a second completes nothing.

use std::time::Duration;

use fleetscope_proto::ListResourceTypesRequest;

use super::args::ServerArg;
use super::connect::{ClientError, connect};

/// How long completion waits for the server.
const PATIENCE: Duration = Duration::from_secs(1);

/// What `__complete` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Completing {
    /// The collected resource types: each one's name (`pods`, `deployments.apps`),
    /// and its plural alone when it has a group.
    Resources,
    /// The clusters' names.
    Clusters,
}

/// The words that complete `what`, from the server at `server`.
pub async fn words(server: &ServerArg, what: Completing) -> Result<Vec<String>, ClientError> {
    let asked = async {
        let mut client = connect(server).await?;
        let words = match what {
            Completing::Resources => client
                .list_resource_types(ListResourceTypesRequest::default())
                .await?
                .into_inner()
                .resource_types
                .into_iter()
                .flat_map(|t| {
                    let plural = (!t.group.is_empty())
                        .then(|| t.name.split('.').next().unwrap_or_default().to_string());
                    std::iter::once(t.name).chain(plural)
                })
                .collect(),
            Completing::Clusters => super::status::cluster_names(&mut client).await?,
        };
        Ok::<Vec<String>, ClientError>(words)
    };
    match tokio::time::timeout(PATIENCE, asked).await {
        Ok(words) => {
            let mut words = words?;
            words.sort();
            words.dedup();
            Ok(words)
        }
        Err(_) => Ok(Vec::new()),
    }
}

/// What `fleetscope completion bash` adds after clap's script: completion from the
/// server for resource types and cluster names, clap's for everything else.
pub const BASH: &str = r#"
# Resource types and cluster names come from the server (fleetscope __complete).
_fleetscope_from_server() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local -a server=()
    local i positional=0 sub=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            --server|-s|--ca|--cert|--key|--token-file|--tls-server-name)
                server+=("${COMP_WORDS[i]}" "${COMP_WORDS[i+1]}"); ((i++)) ;;
            --cluster|--cluster-selector|-n|--namespace|-l|--selector|--field-selector|-o|--output|--sort-by|--limit|--context)
                ((i++)) ;;
            -*) ;;
            *) if [[ -z "$sub" ]]; then sub="${COMP_WORDS[i]}"; else ((positional++)); fi ;;
        esac
    done
    if [[ "$prev" == "--cluster" ]]; then
        COMPREPLY=($(compgen -W "$(fleetscope __complete clusters "${server[@]}" 2>/dev/null)" -- "$cur"))
        return 0
    fi
    case "$sub" in
        get|describe|count|watch)
            if [[ $positional -eq 0 && "$cur" != -* ]]; then
                COMPREPLY=($(compgen -W "$(fleetscope __complete resources "${server[@]}" 2>/dev/null)" -- "$cur"))
                return 0
            fi ;;
    esac
    _fleetscope "$@"
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _fleetscope_from_server -o nosort -o bashdefault -o default fleetscope
else
    complete -F _fleetscope_from_server -o bashdefault -o default fleetscope
fi
"#;
