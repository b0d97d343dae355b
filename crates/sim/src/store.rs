//! The simulated cluster's storage: what etcd and the watch cache are to a real
//! apiserver. One resourceVersion sequence per cluster; a bounded history of changes;
//! reads at any retained resourceVersion by undoing history over a persistent map, so
//! a snapshot costs nothing to take.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use fleetscope_model::selector::{Fields, Labels, json_path, scalar_text};
use imbl::OrdMap;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::resource::ResourceDef;
use crate::status::ApiError;

mod objects;

pub use objects::merge_patch;
use objects::{defaults, metadata_mut, random_suffix, resolve_namespace, validate_name};

/// One stored object, serialised once at write time.
#[derive(Debug)]
pub struct StoredObject {
    /// `namespace/name`, or `name` for cluster-scoped objects: the storage order.
    pub key: Arc<str>,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// metadata.resourceVersion.
    pub rv: u64,
    /// The object as JSON without `kind` and `apiVersion`, as list items are served.
    pub body: Bytes,
    /// metadata.labels.
    pub labels: Vec<(String, String)>,
    /// The values of the type's selectable fields.
    pub fields: Vec<(String, String)>,
}

impl StoredObject {
    /// The object as JSON with `kind` and `apiVersion` first, as GET and watch events carry it.
    pub fn with_type_meta(&self, def: &ResourceDef) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 64);
        self.write_with_type_meta(def, &mut out);
        out
    }

    /// Appends [`Self::with_type_meta`] to `out`, without an allocation of its own.
    pub fn write_with_type_meta(&self, def: &ResourceDef, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"kind\":\"");
        out.extend_from_slice(def.kind.as_bytes());
        out.extend_from_slice(b"\",\"apiVersion\":\"");
        if !def.group.is_empty() {
            out.extend_from_slice(def.group.as_bytes());
            out.push(b'/');
        }
        out.extend_from_slice(def.version.as_bytes());
        out.push(b'"');
        if self.body.len() > 2 {
            out.push(b',');
        }
        out.extend_from_slice(&self.body[1..]);
    }

    /// The object decoded.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

impl Labels for StoredObject {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_slice().label(key)
    }
}

impl Fields for StoredObject {
    fn field(&self, path: &str) -> Option<std::borrow::Cow<'_, str>> {
        self.fields.as_slice().field(path)
    }
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Deleted.
    Deleted,
}

impl ChangeKind {
    /// The watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One applied change, kept in history and broadcast to watches.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// The type of the object.
    pub def: Arc<ResourceDef>,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (for a delete: its last state, at the delete's rv).
    pub object: Arc<StoredObject>,
    /// The object before the change; `None` for a create.
    pub prev: Option<Arc<StoredObject>>,
}

/// A resourceVersion constraint on a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// The latest state.
    Latest,
    /// Exactly this resourceVersion.
    Exact(u64),
    /// This resourceVersion or newer.
    NotOlderThan(u64),
}

/// How a write is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Write {
    /// Check and compute it, and change nothing (`dryRun=All`).
    pub dry_run: bool,
}

/// A consistent view of one resource type at one resourceVersion.
#[derive(Clone)]
pub struct Snapshot {
    /// The resourceVersion the view is at.
    pub rv: u64,
    /// The type.
    pub def: Arc<ResourceDef>,
    /// The objects by key.
    pub objects: OrdMap<Arc<str>, Arc<StoredObject>>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// From the current state: the current objects first (as synthetic ADDED events).
    Now,
    /// Every change after this resourceVersion.
    After(u64),
}

/// A registered watch: what it must send first, then the live feed.
pub struct Subscription {
    /// The resourceVersion the watch starts at.
    pub start_rv: u64,
    /// The current objects, for a watch from now.
    pub initial: Vec<Arc<StoredObject>>,
    /// Retained changes after the requested resourceVersion.
    pub backlog: Vec<Arc<Change>>,
    /// Live changes.
    pub live: broadcast::Receiver<Arc<Change>>,
}

struct ResourceState {
    def: Arc<ResourceDef>,
    objects: OrdMap<Arc<str>, Arc<StoredObject>>,
}

struct State {
    rv: u64,
    resources: BTreeMap<String, ResourceState>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// The oldest resourceVersion still readable: history holds every change after it.
    oldest_rv: u64,
}

/// The versioned object store of one simulated cluster.
pub struct Store {
    state: RwLock<State>,
    changes: broadcast::Sender<Arc<Change>>,
    cluster_name: String,
}

pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn key_of(namespace: &str, name: &str) -> Arc<str> {
    if namespace.is_empty() {
        Arc::from(name)
    } else {
        Arc::from(format!("{namespace}/{name}"))
    }
}

impl Store {
    /// An empty store serving `defs`, keeping `history_limit` changes, broadcasting
    /// through a channel of `watch_buffer` slots (a watch further behind is ended).
    pub fn new(
        cluster_name: &str,
        defs: Vec<ResourceDef>,
        history_limit: usize,
        watch_buffer: usize,
    ) -> Self {
        let resources = defs
            .into_iter()
            .map(|d| {
                (
                    d.id(),
                    ResourceState {
                        def: Arc::new(d),
                        objects: OrdMap::new(),
                    },
                )
            })
            .collect();
        let (changes, _) = broadcast::channel(watch_buffer.max(16));
        Self {
            state: RwLock::new(State {
                rv: 1,
                resources,
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                oldest_rv: 1,
            }),
            changes,
            cluster_name: cluster_name.to_string(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every change from now on, as watches receive them (a receiver that falls more
    /// than the watch buffer behind is told how many it missed).
    pub fn changes(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.read().rv
    }

    /// The oldest resourceVersion still readable.
    pub fn oldest_resource_version(&self) -> u64 {
        self.read().oldest_rv
    }

    /// Every served type.
    pub fn defs(&self) -> Vec<Arc<ResourceDef>> {
        self.read()
            .resources
            .values()
            .map(|r| r.def.clone())
            .collect()
    }

    /// The type served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.read()
            .resources
            .values()
            .find(|r| r.def.group == group && r.def.version == version && r.def.plural == plural)
            .map(|r| r.def.clone())
    }

    /// The type with this id (`pods`, `deployments.apps`).
    pub fn def(&self, id: &str) -> Option<Arc<ResourceDef>> {
        self.read().resources.get(id).map(|r| r.def.clone())
    }

    /// Starts serving a type (as a CRD being created).
    pub fn add_resource(&self, def: ResourceDef) {
        self.write()
            .resources
            .entry(def.id())
            .or_insert_with(|| ResourceState {
                def: Arc::new(def),
                objects: OrdMap::new(),
            });
    }

    /// Stops serving a type and drops its objects (as a CRD being deleted).
    pub fn remove_resource(&self, id: &str) -> bool {
        self.write().resources.remove(id).is_some()
    }

    /// How many objects of a type are held.
    pub fn count(&self, id: &str) -> usize {
        self.read().resources.get(id).map_or(0, |r| r.objects.len())
    }

    /// Reads one object.
    pub fn get(&self, id: &str, namespace: &str, name: &str) -> Option<Arc<StoredObject>> {
        self.read()
            .resources
            .get(id)?
            .objects
            .get(&key_of(namespace, name))
            .cloned()
    }

    /// A consistent view of one type at the requested resourceVersion.
    pub fn snapshot(&self, id: &str, at: ReadAt) -> Result<Snapshot, ApiError> {
        let state = self.read();
        let res = state
            .resources
            .get(id)
            .ok_or_else(ApiError::unknown_resource)?;
        let target = match at {
            ReadAt::Latest => state.rv,
            ReadAt::NotOlderThan(rv) if rv <= state.rv => state.rv,
            ReadAt::NotOlderThan(rv) | ReadAt::Exact(rv) if rv > state.rv => {
                return Err(ApiError::too_large_rv(rv, state.rv));
            }
            ReadAt::Exact(rv) if rv < state.oldest_rv => return Err(ApiError::expired_rv()),
            ReadAt::Exact(rv) | ReadAt::NotOlderThan(rv) => rv,
        };
        let mut objects = res.objects.clone();
        for change in state.history.iter().rev().take_while(|c| c.rv > target) {
            if change.def.id() != id {
                continue;
            }
            match &change.prev {
                Some(prev) => objects.insert(prev.key.clone(), prev.clone()),
                None => objects.remove(&change.object.key),
            };
        }
        Ok(Snapshot {
            rv: target,
            def: res.def.clone(),
            objects,
        })
    }

    /// Registers a watch of one type.
    pub fn subscribe(&self, id: &str, from: WatchFrom) -> Result<Subscription, ApiError> {
        let state = self.read();
        let res = state
            .resources
            .get(id)
            .ok_or_else(ApiError::unknown_resource)?;
        let live = self.changes.subscribe();
        match from {
            WatchFrom::Now => Ok(Subscription {
                start_rv: state.rv,
                initial: res.objects.values().cloned().collect(),
                backlog: Vec::new(),
                live,
            }),
            WatchFrom::After(rv) => {
                if rv < state.oldest_rv {
                    return Err(ApiError::too_old_rv(rv, state.oldest_rv));
                }
                if rv > state.rv {
                    return Err(ApiError::too_large_rv(rv, state.rv));
                }
                let skip = state.history.partition_point(|c| c.rv <= rv);
                let backlog = state
                    .history
                    .iter()
                    .skip(skip)
                    .filter(|c| c.def.id() == id)
                    .cloned()
                    .collect();
                Ok(Subscription {
                    start_rv: rv,
                    initial: Vec::new(),
                    backlog,
                    live,
                })
            }
        }
    }

    /// Forgets all history: every older resourceVersion becomes too old to read or watch from.
    pub fn compact(&self) {
        let mut state = self.write();
        state.history.clear();
        state.oldest_rv = state.rv;
    }

    /// Renumbers every object from a fresh resourceVersion sequence, as a restore of
    /// etcd from a backup does, and forgets history. Returns the new resourceVersion.
    pub fn reset_resource_versions(&self) -> u64 {
        let mut state = self.write();
        let mut rv = 1;
        for res in state.resources.values_mut() {
            let def = res.def.clone();
            let renumbered: Vec<_> = res
                .objects
                .values()
                .map(|o| {
                    rv += 1;
                    let mut value = o.value();
                    value["metadata"]["resourceVersion"] = json!(rv.to_string());
                    encode(&def, value, rv)
                })
                .collect();
            res.objects = renumbered
                .into_iter()
                .map(|o| (o.key.clone(), Arc::new(o)))
                .collect();
        }
        state.rv = rv;
        state.oldest_rv = rv;
        state.history.clear();
        rv
    }

    fn commit(
        &self,
        state: &mut State,
        id: &str,
        kind: ChangeKind,
        object: Arc<StoredObject>,
        prev: Option<Arc<StoredObject>>,
    ) {
        let Some(res) = state.resources.get_mut(id) else {
            return;
        };
        match kind {
            ChangeKind::Deleted => res.objects.remove(&object.key),
            _ => res.objects.insert(object.key.clone(), object.clone()),
        };
        let change = Arc::new(Change {
            rv: object.rv,
            def: res.def.clone(),
            kind,
            object,
            prev,
        });
        state.rv = change.rv;
        state.history.push_back(change.clone());
        while state.history.len() > state.history_limit {
            if let Some(old) = state.history.pop_front() {
                state.oldest_rv = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.changes.send(change);
    }

    /// The type and the stored object a write names, or 404.
    fn existing(
        state: &State,
        id: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(Arc<ResourceDef>, Arc<StoredObject>), ApiError> {
        let def = Self::def_in(state, id)?;
        let prev = state
            .resources
            .get(id)
            .and_then(|r| r.objects.get(&key_of(namespace, name)).cloned());
        match prev {
            Some(prev) => Ok((def, prev)),
            None => Err(ApiError::not_found(&def, name)),
        }
    }

    fn def_in(state: &State, id: &str) -> Result<Arc<ResourceDef>, ApiError> {
        state
            .resources
            .get(id)
            .map(|r| r.def.clone())
            .ok_or_else(ApiError::unknown_resource)
    }

    /// Creates an object. The namespace comes from `namespace` or the object's metadata.
    pub fn create(
        &self,
        id: &str,
        namespace: Option<&str>,
        value: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.create_with(id, namespace, value, Write::default())
    }

    /// [`Store::create`], as a dry run when asked.
    pub fn create_with(
        &self,
        id: &str,
        namespace: Option<&str>,
        mut value: Value,
        w: Write,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let mut state = self.write();
        let def = Self::def_in(&state, id)?;
        let meta = metadata_mut(&def, &mut value)?;
        let namespace = resolve_namespace(&def, namespace, meta)?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => format!("{prefix}{}", random_suffix()),
                _ => {
                    return Err(ApiError::invalid(
                        &def.group,
                        &def.kind,
                        "",
                        &["metadata.name: Required value: name or generateName is required"],
                    ));
                }
            },
        };
        validate_name(&def, &name)?;
        if def.namespaced
            && !state
                .resources
                .get("namespaces")
                .is_some_and(|r| r.objects.contains_key(namespace.as_str()))
        {
            return Err(ApiError::namespace_not_found(&namespace));
        }
        let key = key_of(&namespace, &name);
        if state
            .resources
            .get(id)
            .is_some_and(|r| r.objects.contains_key(&key))
        {
            return Err(ApiError::already_exists(&def, &name));
        }
        let rv = state.rv + 1;
        meta.insert("name".into(), json!(name));
        if def.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if def.group.is_empty()
            && matches!(
                def.plural.as_str(),
                "configmaps" | "secrets" | "namespaces" | "nodes" | "services" | "pods"
            )
        {
            meta.remove("generation");
        } else {
            meta.insert("generation".into(), json!(1));
        }
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        if def.plural == "namespaces" && value.get("status").is_none() {
            value["status"] = json!({"phase": "Active"});
        }
        if def.group.is_empty() {
            defaults(&def.plural, &mut value, rv);
        }
        let object = Arc::new(encode(&def, value, rv));
        if !w.dry_run {
            self.commit(&mut state, id, ChangeKind::Added, object.clone(), None);
        }
        Ok(object)
    }

    /// Replaces an object. A resourceVersion in the body must match the stored one.
    pub fn update(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        value: Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.update_with(id, namespace, name, value, Write::default())
    }

    /// [`Store::update`], as a dry run when asked.
    pub fn update_with(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        mut value: Value,
        w: Write,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let mut state = self.write();
        let (def, prev) = Self::existing(&state, id, namespace, name)?;
        let meta = metadata_mut(&def, &mut value)?;
        if let Some(body_name) = meta.get("name").and_then(Value::as_str)
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta.get("resourceVersion").and_then(Value::as_str)
            && !rv.is_empty()
            && rv != prev.rv.to_string()
        {
            return Err(ApiError::conflict(&def, name));
        }
        let old = prev.value();
        let rv = state.rv + 1;
        // Identity and creation fields are the server's, whatever the body says.
        for field in ["uid", "creationTimestamp", "generation"] {
            match old["metadata"].get(field) {
                Some(v) => meta.insert(field.into(), v.clone()),
                None => meta.remove(field),
            };
        }
        meta.insert("name".into(), json!(name));
        if def.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        }
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        if value.get("spec").is_some()
            && value.get("spec") != old.get("spec")
            && let Some(g) = old["metadata"].get("generation").and_then(Value::as_i64)
        {
            value["metadata"]["generation"] = json!(g + 1);
        }
        let object = Arc::new(encode(&def, value, rv));
        if !w.dry_run {
            self.commit(
                &mut state,
                id,
                ChangeKind::Modified,
                object.clone(),
                Some(prev),
            );
        }
        Ok(object)
    }

    /// Applies a JSON merge patch (RFC 7386) to an object.
    pub fn patch(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.patch_with(
            id,
            namespace,
            name,
            |value| {
                merge_patch(value, patch);
                Ok(())
            },
            Write::default(),
        )
    }

    /// Changes an object with `apply` (a patch of any kind), as a dry run when asked.
    /// A resourceVersion the patch sets must match the stored one.
    pub fn patch_with(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        apply: impl Fn(&mut Value) -> Result<(), ApiError>,
        w: Write,
    ) -> Result<Arc<StoredObject>, ApiError> {
        // Read, patch, then update with the read resourceVersion: a concurrent write
        // between the two is a conflict, which the retry below resolves.
        for _ in 0..8 {
            let def = self.def(id).ok_or_else(ApiError::unknown_resource)?;
            let current = self
                .get(id, namespace, name)
                .ok_or_else(|| ApiError::not_found(&def, name))?;
            let mut value = current.value();
            apply(&mut value)?;
            let pinned = value["metadata"]
                .get("resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|rv| rv != current.rv.to_string());
            if !pinned {
                value["metadata"]["resourceVersion"] = json!(current.rv.to_string());
            }
            match self.update_with(id, namespace, name, value, w) {
                Err(e) if e.reason == "Conflict" && !pinned => continue,
                other => return other,
            }
        }
        let def = self.def(id).ok_or_else(ApiError::unknown_resource)?;
        Err(ApiError::conflict(&def, name))
    }

    /// Deletes an object; returns its last state, at the delete's resourceVersion.
    pub fn delete(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.delete_with(id, namespace, name, Write::default())
    }

    /// [`Store::delete`], as a dry run when asked.
    pub fn delete_with(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        w: Write,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let mut state = self.write();
        let (def, prev) = Self::existing(&state, id, namespace, name)?;
        let rv = state.rv + 1;
        let mut value = prev.value();
        value["metadata"]["resourceVersion"] = json!(rv.to_string());
        let object = Arc::new(encode(&def, value, rv));
        if !w.dry_run {
            self.commit(
                &mut state,
                id,
                ChangeKind::Deleted,
                object.clone(),
                Some(prev),
            );
        }
        Ok(object)
    }

    /// Stores `body` verbatim as an object, bypassing validation: a fault that shows how
    /// clients cope with an object no real apiserver would hold (wrong shapes, bad JSON).
    /// It appears in lists and watches like any other object.
    pub fn insert_raw(
        &self,
        id: &str,
        namespace: &str,
        name: &str,
        body: &str,
    ) -> Result<(), ApiError> {
        let mut state = self.write();
        let def = Self::def_in(&state, id)?;
        let rv = state.rv + 1;
        let object = Arc::new(StoredObject {
            key: key_of(namespace, name),
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: String::new(),
            rv,
            body: Bytes::copy_from_slice(body.as_bytes()),
            labels: Vec::new(),
            fields: vec![
                ("metadata.name".into(), name.to_string()),
                ("metadata.namespace".into(), namespace.to_string()),
            ],
        });
        let _ = def;
        self.commit(&mut state, id, ChangeKind::Added, object, None);
        Ok(())
    }

    /// The name of the cluster this store belongs to.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }
}

/// Serialises an object for storage: no kind or apiVersion, labels and selectable fields lifted out.
fn encode(def: &ResourceDef, mut value: Value, rv: u64) -> StoredObject {
    if let Some(obj) = value.as_object_mut() {
        obj.remove("kind");
        obj.remove("apiVersion");
    }
    let meta = &value["metadata"];
    let text = |k: &str| {
        meta.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (namespace, name, uid) = (text("namespace"), text("name"), text("uid"));
    let labels = meta
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mut fields = vec![("metadata.name".to_string(), name.clone())];
    if def.namespaced {
        fields.push(("metadata.namespace".to_string(), namespace.clone()));
    }
    for path in &def.selectable_fields {
        let v = json_path(&value, path)
            .and_then(scalar_text)
            .map(|c| c.into_owned())
            .unwrap_or_default();
        fields.push((path.clone(), v));
    }
    let body = Bytes::from(serde_json::to_vec(&value).unwrap_or_else(|_| b"{}".to_vec()));
    StoredObject {
        key: key_of(&namespace, &name),
        namespace,
        name,
        uid,
        rv,
        body,
        labels,
        fields,
    }
}

#[cfg(test)]
mod tests;
