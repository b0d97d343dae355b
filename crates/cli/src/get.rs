//! `fleetscope get` and `count`: objects listed page by page across the fleet (or
//! fetched by name), printed as kubectl prints them.

use std::time::SystemTime;

use super::args;
use super::connect::{Client, ClientError};
use super::follow::Follower;
use super::jsonpath;
use super::lookup::{
    Listed, Target, check_clusters, list_all, resource_error, table_for, targets, where_looked,
};
use super::output::{self, Item};
use super::printing::{print, print_items, print_streamed, println_flush, warn_not_current};
use fleetscope_proto::CountRequest;

/// `get`: a list (every page), or objects by name across the selected clusters and
/// namespaces; then, with `-w`, changes as they arrive. Several types (or TYPE/NAME
/// arguments) print a table per type, each name prefixed with its type.
pub async fn get(client: &mut Client, args: args::GetArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let targets = targets(&args.query.resource, &args.names)?;
    let sort_by = args
        .sort_by
        .as_deref()
        .map(jsonpath::Template::parse)
        .transpose()
        .map_err(|e| ClientError::Message(format!("--sort-by: {e}")))?;
    if let [target] = &targets[..] {
        return get_one(client, &args, target, sort_by.as_ref()).await;
    }
    if args.watch {
        return Err(ClientError::Message(format!(
            "error: watch is only supported on individual resources and resource collections, but {} resources were found",
            targets.len()
        )));
    }
    // Items by type, in the order the types were named.
    let mut groups: Vec<(String, Vec<Item>)> = Vec::new();
    let mut missing = Vec::new();
    for target in &targets {
        let Listed { items, .. } = list_all(client, &target.query(&args.query), args.limit).await?;
        if items.is_empty()
            && let Some(m) = target.not_found(&args.query)
        {
            missing.push(m);
        }
        match groups.iter_mut().find(|(r, _)| *r == target.resource) {
            Some((_, held)) => held.extend(items),
            None => groups.push((target.resource.clone(), items)),
        }
    }
    for (_, items) in &mut groups {
        if let Some(by) = &sort_by {
            output::sort(items, by);
        }
    }
    groups.retain(|(_, items)| !items.is_empty());
    if groups.is_empty() && missing.is_empty() {
        eprintln!("No resources found{}.", where_looked(&args.query));
        return Ok(());
    }
    let format = &args.print.output;
    if format.is_table() {
        let one_namespace = args.query.namespaces.len() == 1;
        let now = SystemTime::now();
        for (i, (_, items)) in groups.iter().enumerate() {
            let mut table = table_for(client, items, &args.print, one_namespace, false).await;
            table.typed_names = true;
            let rows: Vec<Vec<String>> = items.iter().map(|i| table.row(i, now, None)).collect();
            let header = table.header();
            if i > 0 {
                print("\n");
            }
            print(&output::align(
                (!args.print.no_headers).then_some(&header[..]),
                &rows,
            ));
        }
    } else {
        let all: Vec<Item> = groups.into_iter().flat_map(|(_, items)| items).collect();
        if !all.is_empty() || missing.is_empty() {
            print_items(&all, format, false);
        }
    }
    if !missing.is_empty() {
        return Err(ClientError::Message(missing.join("\n")));
    }
    Ok(())
}

/// `get` of one type (and one name, or all).
pub(super) async fn get_one(
    client: &mut Client,
    args: &args::GetArgs,
    target: &Target,
    sort_by: Option<&jsonpath::Template>,
) -> Result<(), ClientError> {
    let query = target.query(&args.query);
    // With --watch, the initial objects come on the Watch itself (a router resumes a
    // Watch by positions, never from a List's revision); without, a paged List.
    let (mut items, mut follower) = if args.watch {
        let mut follower = Follower::new(client.clone(), query.clone(), 0, true);
        let items = follower.initial_objects().await?;
        (items, Some(follower))
    } else {
        (list_all(client, &query, args.limit).await?.items, None)
    };
    if let Some(by) = sort_by {
        output::sort(&mut items, by);
    }
    let resource = &target.resource;
    if let Some(name) = &target.name {
        if items.is_empty() {
            return Err(ClientError::Message(
                target.not_found(&args.query).unwrap_or_default(),
            ));
        }
        let places = output::places(&items);
        if items.len() > 1 {
            let listed: Vec<String> = places.keys().cloned().collect();
            eprintln!(
                "{resource} {name:?} is ambiguous: it names {} objects ({}); narrow with --cluster and -n",
                items.len(),
                listed.join(", ")
            );
        }
    } else if items.is_empty() && !args.watch {
        eprintln!("No resources found{}.", where_looked(&args.query));
        return Ok(());
    }
    let one_namespace = args.query.namespaces.len() == 1;
    let format = &args.print.output;
    let table = if format.is_table() {
        let table = table_for(client, &items, &args.print, one_namespace, false).await;
        let now = SystemTime::now();
        let rows: Vec<Vec<String>> = items.iter().map(|i| table.row(i, now, None)).collect();
        let header = table.header();
        print(&output::align(
            (!args.print.no_headers && !items.is_empty()).then_some(&header[..]),
            &rows,
        ));
        Some(table)
    } else {
        print_items(&items, format, target.name.is_some());
        None
    };
    let Some(mut follower) = follower.take() else {
        return Ok(());
    };
    // Changes after the initial objects, each as a row (or an object) of its own.
    let mut table = table.filter(|t| !t.columns.is_empty() || t.custom.is_some());
    loop {
        let event = follower.next().await?;
        let Some(o) = &event.object else { continue };
        let item = Item::from_proto(o);
        match format {
            f if f.is_table() => {
                let t = match table.take() {
                    Some(t) => t,
                    None => {
                        table_for(
                            client,
                            std::slice::from_ref(&item),
                            &args.print,
                            one_namespace,
                            false,
                        )
                        .await
                    }
                };
                println_flush(&output::align(
                    None,
                    &[t.row(&item, SystemTime::now(), None)],
                ));
                table = Some(t);
            }
            other => print_streamed(&item, other),
        }
    }
}

/// `count`: grouped counts.
pub async fn count(client: &mut Client, args: args::CountArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let query = args.query.query();
    let r = client
        .count(CountRequest {
            query: Some(query.clone()),
            group_by: args.group_by.clone(),
        })
        .await
        .map_err(|s| resource_error(&query.resource, s))?
        .into_inner();
    // A count over a cluster that failed or is syncing is not the cluster's count.
    warn_not_current(&r.clusters);
    if args.output == "json" {
        let groups: Vec<serde_json::Value> = r
            .groups
            .iter()
            .map(|g| {
                let key: serde_json::Map<String, serde_json::Value> = args
                    .group_by
                    .iter()
                    .cloned()
                    .zip(g.key.iter().cloned().map(serde_json::Value::String))
                    .collect();
                serde_json::json!({"key": key, "count": g.count.to_string()})
            })
            .collect();
        print(&output::to_json(&serde_json::json!({
            "resource": query.resource, "groupBy": args.group_by, "groups": groups,
            // 64-bit integers as strings, as the proto3 JSON mapping writes them: a
            // revision is about 1.8 × 10^18, past what a double (jq, JavaScript) holds.
            "total": r.total.to_string(), "revision": r.revision.to_string(),
        })));
        return Ok(());
    }
    let mut header: Vec<String> = args.group_by.iter().map(|g| g.to_uppercase()).collect();
    header.push("COUNT".into());
    let mut rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| g.key.iter().cloned().chain([g.count.to_string()]).collect())
        .collect();
    if !args.group_by.is_empty() {
        let mut total = vec![String::new(); args.group_by.len()];
        total[0] = "TOTAL".into();
        total.push(r.total.to_string());
        rows.push(total);
    } else {
        rows.push(vec![r.total.to_string()]);
    }
    print(&output::align(Some(&header), &rows));
    Ok(())
}
