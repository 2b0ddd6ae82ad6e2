package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// object is the part of a Kubernetes object these tests read. Unknown fields are ignored: the
// API server, not this test, is the schema's authority.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // Kustomization
	Spec       struct {
		Replicas     *int          `yaml:"replicas"`
		MinAvailable *int          `yaml:"minAvailable"`
		Selector     selector      `yaml:"selector"`
		Template     podTemplate   `yaml:"template"`
		Ports        []servicePort `yaml:"ports"`
	} `yaml:"spec"`
}

type selector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// UnmarshalYAML accepts both a Deployment's selector (matchLabels) and a Service's (a plain map).
func (s *selector) UnmarshalYAML(n *yaml.Node) error {
	var withMatch struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := n.Decode(&withMatch); err == nil && withMatch.MatchLabels != nil {
		s.MatchLabels = withMatch.MatchLabels
		return nil
	}
	return n.Decode(&s.MatchLabels)
}

type servicePort struct {
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		SecurityContext struct {
			RunAsNonRoot *bool `yaml:"runAsNonRoot"`
			RunAsUser    *int  `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []podContainer `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type podContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []struct {
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// readObjects decodes every YAML document of every file in dir, keyed "Kind/name".
func readObjects(t *testing.T, dir string) map[string]object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	objs := map[string]object{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			var o object
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if o.APIVersion == "" || o.Kind == "" {
				t.Errorf("%s document %d: apiVersion and kind are required", f, i)
			}
			if o.Metadata.Name == "" && o.Kind != "Kustomization" {
				t.Errorf("%s document %d: %s without metadata.name", f, i, o.Kind)
			}
			id := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[id]; dup {
				t.Errorf("%s: %s defined twice", f, id)
			}
			objs[id] = o
		}
	}
	return objs
}

func mustGet(t *testing.T, objs map[string]object, id string) object {
	t.Helper()
	o, ok := objs[id]
	if !ok {
		keys := make([]string, 0, len(objs))
		for k := range objs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		t.Fatalf("%s missing; have %v", id, keys)
	}
	return o
}

func TestKubernetesManifests(t *testing.T) {
	objs := readObjects(t, "k8s")
	dep := mustGet(t, objs, "Deployment/shardgate-router")
	svc := mustGet(t, objs, "Service/shardgate-router")
	pdb := mustGet(t, objs, "PodDisruptionBudget/shardgate-router")
	job := mustGet(t, objs, "Job/shardgate-migrate")
	secret := mustGet(t, objs, "Secret/shardgate-shard-dsns")
	kust := mustGet(t, objs, "Kustomization/")

	// Kustomize applies what it lists; the example Secret must never be among it.
	for _, r := range kust.Resources {
		if _, err := os.Stat(filepath.Join("k8s", r)); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		}
		if strings.Contains(r, "secret") {
			t.Errorf("kustomization applies %s: the DSN Secret is created out of band", r)
		}
	}

	if r := dep.Spec.Replicas; r == nil || *r < 2 {
		t.Errorf("Deployment replicas %v, want at least 2", r)
	}
	podLabels := dep.Spec.Template.Metadata.Labels
	if !subset(dep.Spec.Selector.MatchLabels, podLabels) || len(dep.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("Deployment selector %v does not select its pods %v", dep.Spec.Selector.MatchLabels, podLabels)
	}
	if !subset(svc.Spec.Selector.MatchLabels, podLabels) || len(svc.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("Service selector %v does not select the router pods %v", svc.Spec.Selector.MatchLabels, podLabels)
	}
	if !subset(pdb.Spec.Selector.MatchLabels, podLabels) || len(pdb.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("PodDisruptionBudget selector %v does not select the router pods %v", pdb.Spec.Selector.MatchLabels, podLabels)
	}
	if m := pdb.Spec.MinAvailable; m == nil || dep.Spec.Replicas != nil && *m >= *dep.Spec.Replicas || *m < 1 {
		t.Errorf("PodDisruptionBudget minAvailable %v must be at least 1 and below replicas, or no node could ever drain", m)
	}

	for _, pod := range []object{dep, job} {
		sc := pod.Spec.Template.Spec.SecurityContext
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			t.Errorf("%s: pod must run as a non-root uid", pod.Kind)
		}
		if len(pod.Spec.Template.Spec.Containers) != 1 {
			t.Fatalf("%s: want one container", pod.Kind)
		}
		c := pod.Spec.Template.Spec.Containers[0]
		if ro := c.SecurityContext.ReadOnlyRootFilesystem; ro == nil || !*ro {
			t.Errorf("%s: readOnlyRootFilesystem must be true", pod.Kind)
		}
		if ape := c.SecurityContext.AllowPrivilegeEscalation; ape == nil || *ape {
			t.Errorf("%s: allowPrivilegeEscalation must be false", pod.Kind)
		}
		if !slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
			t.Errorf("%s: capabilities must drop ALL", pod.Kind)
		}
		for _, k := range []string{"cpu", "memory"} {
			if c.Resources.Requests[k] == "" || c.Resources.Limits[k] == "" {
				t.Errorf("%s: resources.requests and limits need %s", pod.Kind, k)
			}
		}
		if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != secret.Metadata.Name {
			t.Errorf("%s: DSNs must come from Secret %s via envFrom", pod.Kind, secret.Metadata.Name)
		}
		cfgPath, _ := checkMounts(t, pod, objs)
		if want := []string{"--config", cfgPath}; len(c.Args) != 3 || !slices.Equal(c.Args[1:], want) {
			t.Errorf("%s: args %v, want [<command> --config %s]", pod.Kind, c.Args, cfgPath)
		}
	}
	if args := job.Spec.Template.Spec.Containers[0].Args; len(args) == 0 || args[0] != "migrate" {
		t.Errorf("Job runs %v, want router migrate", args)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("Deployment runs %v, want router serve", c.Args)
	}
	// Liveness must not depend on shards: a shard outage would otherwise restart every router.
	if p := c.LivenessProbe; p == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v, want GET /healthz", p)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet.Path != "/readyz?partial=1" {
		t.Errorf("readiness probe %+v, want GET /readyz?partial=1", p)
	}
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort == 8080
	}
	for _, p := range []*probe{c.LivenessProbe, c.ReadinessProbe} {
		if p != nil && !ports[p.HTTPGet.Port] {
			t.Errorf("probe port %q is not the container's port 8080", p.HTTPGet.Port)
		}
	}
	for _, sp := range svc.Spec.Ports {
		if !ports[sp.TargetPort] {
			t.Errorf("Service targetPort %q is not the container's port 8080", sp.TargetPort)
		}
	}

	// /metrics and /admin/* have their own port, which Prometheus scrapes and the Service
	// does not expose.
	_, cfg := checkMounts(t, dep, objs)
	adminPort := listenPort(t, "Deployment router.yaml admin.listen", cfg.Admin.Listen)
	declared := false
	for _, p := range c.Ports {
		declared = declared || p.ContainerPort == adminPort
	}
	if !declared {
		t.Errorf("the container does not declare the admin port %d", adminPort)
	}
	if got := dep.Spec.Template.Metadata.Annotations["prometheus.io/port"]; got != strconv.Itoa(adminPort) {
		t.Errorf("prometheus.io/port annotation %q, want the admin port %d", got, adminPort)
	}
	for _, sp := range svc.Spec.Ports {
		if sp.TargetPort == strconv.Itoa(adminPort) || sp.TargetPort == "admin" {
			t.Errorf("the Service exposes the admin port (%q)", sp.TargetPort)
		}
	}
}

// listenPort returns the port of a host:port listen address, failing when it has none: the
// shipped configs must keep the admin endpoints off the API listener.
func listenPort(t *testing.T, what, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n == 0 {
		t.Fatalf("%s = %q: want host:port, so /metrics and /admin/* stay off the API port", what, addr)
	}
	return n
}

// checkMounts checks that pod mounts the router.yaml and shard map ConfigMaps, that router.yaml
// parses with config.Parse at its mount path and names the mounted shard map, and that the map
// parses with shardmap.Parse once the example Secret's variables are in the environment. It
// returns router.yaml's path in the container and the parsed configuration.
func checkMounts(t *testing.T, pod object, objs map[string]object) (string, *config.Config) {
	t.Helper()
	spec := pod.Spec.Template.Spec
	files := map[string]string{} // path in the container -> content
	for _, m := range spec.Containers[0].VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm := mustGet(t, objs, "ConfigMap/"+v.ConfigMap.Name)
			for k, content := range cm.Data {
				files[path.Join(m.MountPath, k)] = content
			}
		}
	}
	var cfgPath string
	for p := range files {
		if path.Base(p) == "router.yaml" {
			cfgPath = p
		}
	}
	if cfgPath == "" {
		t.Fatalf("%s mounts no router.yaml", pod.Kind)
	}
	cfg, err := config.Parse(cfgPath, []byte(files[cfgPath]))
	if err != nil {
		t.Fatalf("%s: router.yaml: %v", pod.Kind, err)
	}
	mapData, ok := files[cfg.ShardmapPath]
	if !ok {
		t.Fatalf("%s: router.yaml names shard map %s, which is not mounted", pod.Kind, cfg.ShardmapPath)
	}
	secret := mustGet(t, objs, "Secret/shardgate-shard-dsns")
	lookup := func(k string) (string, bool) { v, ok := secret.StringData[k]; return v, ok }
	if _, err := shardmap.Parse(cfg.ShardmapPath, []byte(mapData), lookup); err != nil {
		t.Errorf("%s: shard map with the Secret's variables: %v", pod.Kind, err)
	}
	return cfgPath, cfg
}

func subset(sub, super map[string]string) bool {
	for k, v := range sub {
		if super[k] != v {
			return false
		}
	}
	return true
}

// composeFile is the part of docker-compose.yml these tests read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		PullPolicy  string            `yaml:"pull_policy"`
		Profiles    []string          `yaml:"profiles"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
		ReadOnly    bool              `yaml:"read_only"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// composeDefault interpolates ${VAR:-default} as docker-compose does with VAR unset.
var composeDefault = regexp.MustCompile(`\$\{[A-Z0-9_]+:-([^}]*)\}`)

func TestComposeSandbox(t *testing.T) {
	data, err := os.ReadFile("compose/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	data = composeDefault.ReplaceAll(data, []byte("$1"))
	var cf composeFile
	if err := yaml.Unmarshal(data, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var shards, routers []string
	for name, s := range cf.Services {
		if len(s.Profiles) == 0 && s.PullPolicy != "never" {
			t.Errorf("service %s runs by default but may pull (pull_policy %q): the default `up` must work offline", name, s.PullPolicy)
		}
		switch {
		case strings.HasPrefix(name, "shard-"):
			shards = append(shards, name)
		case strings.HasPrefix(name, "router-"):
			routers = append(routers, name)
			if d := s.DependsOn["migrate"].Condition; d != "service_completed_successfully" {
				t.Errorf("%s depends on migrate with condition %q, want service_completed_successfully", name, d)
			}
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("%s: port %s is published beyond 127.0.0.1", name, p)
				}
			}
		}
	}
	if len(shards) != 3 || len(routers) != 2 {
		t.Errorf("shards %v, routers %v: want 3 and 2", shards, routers)
	}
	if p := cf.Services["prometheus"].Profiles; !slices.Equal(p, []string{"monitoring"}) {
		t.Errorf("prometheus profiles %v, want [monitoring] (its image cannot be pulled offline)", p)
	}
	mig := cf.Services["migrate"]
	if len(mig.Command) == 0 || mig.Command[0] != "migrate" {
		t.Errorf("migrate service runs %v", mig.Command)
	}
	for _, sh := range shards {
		if d := mig.DependsOn[sh].Condition; d != "service_healthy" {
			t.Errorf("migrate depends on %s with condition %q, want service_healthy", sh, d)
		}
	}

	// The mounted files load with the router's parsers, with the routers' environment.
	cfgData, err := os.ReadFile("compose/router.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("/etc/shardgate/router.yaml", cfgData)
	if err != nil {
		t.Fatalf("compose router.yaml: %v", err)
	}
	// Admin endpoints: their own port, published by every router and scraped by Prometheus.
	adminPort := strconv.Itoa(listenPort(t, "compose router.yaml admin.listen", cfg.Admin.Listen))
	promData, err := os.ReadFile("compose/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routers {
		published := false
		for _, p := range cf.Services[r].Ports {
			published = published || strings.HasSuffix(p, ":"+adminPort)
		}
		if !published {
			t.Errorf("%s does not publish the admin port %s", r, adminPort)
		}
		if !strings.Contains(string(promData), `"`+r+":"+adminPort+`"`) {
			t.Errorf("prometheus.yml does not scrape %s:%s", r, adminPort)
		}
	}

	for _, v := range cf.Services["router-1"].Volumes {
		if strings.HasSuffix(v, ":"+cfg.ShardmapPath+":ro") {
			mapData, err := os.ReadFile(filepath.Join("compose", strings.Split(v, ":")[0]))
			if err != nil {
				t.Fatal(err)
			}
			env := cf.Services["router-1"].Environment
			m, err := shardmap.Parse(cfg.ShardmapPath, mapData, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				t.Fatalf("compose shard map: %v", err)
			}
			for _, s := range m.Shards {
				if !strings.Contains(s.DSN, "@"+s.Name+":5432/") {
					t.Errorf("%s's DSN does not point at the service %s", s.Name, s.Name)
				}
			}
			return
		}
	}
	t.Errorf("router-1 does not mount the shard map at %s", cfg.ShardmapPath)
}

// dashboard is the part of a Grafana dashboard these tests read.
type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // collapsed rows hold their panels
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var (
	metricName  = regexp.MustCompile(`\bshardgate_[a-z0-9_]+\b`)
	relayMetric = regexp.MustCompile(`Name:\s*"(shardgate_[a-z0-9_]+)"`)
)

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana/shardgate-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	exported := routerMetrics(t)
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				names := metricName.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: query %q names no shardgate metric", p.Title, tg.Expr)
				}
				for _, n := range names {
					used[n] = true
					if !exported[n] {
						t.Errorf("panel %q: %s is not a metric the router exports", p.Title, n)
					}
				}
			}
		}
	}
	walk(d.Panels)
	for _, want := range []string{
		"shardgate_transfers_total", "shardgate_shard_request_duration_seconds_bucket",
		"shardgate_pool_connections", "shardgate_shardmap_version", "shardgate_shardmap_reloads_total",
		"shardgate_group_commit_size_count", "shardgate_group_commit_stalls_total",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// routerMetrics returns the names of the series a router exports, read from a real router's
// registry after requests that create every labelled family (a rejected and a 503 transfer,
// and a map reload), so the dashboard is checked against the code, not a copy of its names.
func routerMetrics(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "shardmap.yaml")
	// Port 1 on loopback refuses connections at once: the transfer fails fast with a 503.
	mapYAML := "version: 1\nshards:\n  - name: s\n    dsn: postgres://u@127.0.0.1:1/db?sslmode=disable\n    ranges: [\"-\"]\n"
	if err := os.WriteFile(mapPath, []byte(mapYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte("auth:\n  mode: none\nshard_pool:\n  connect_timeout: 500ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, m, err := service.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(cfg, m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	srv, reg := svc.Router, svc.Registry
	for _, body := range []string{`{"src": 1}`, `{"src": 1, "dst": 2, "amount": 3}`} {
		req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "deploy-test")
		req.Header.Set("Content-Type", "application/json")
		srv.ServeHTTP(httptest.NewRecorder(), req)
	}
	srv.Reload(mapPath) //nolint:errcheck // counted whatever the result
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	// The relay's series appear once it has read a shard, which this router cannot reach: the
	// names relay/metrics.go registers count too.
	src, err := os.ReadFile(filepath.Join("..", "relay", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range relayMetric.FindAllStringSubmatch(string(src), -1) {
		names[m[1]] = true
	}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}
