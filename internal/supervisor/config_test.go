package supervisor

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig("/etc/sup.toml", []byte(`
[[service]]
name = "website"
command = ["bash", "-c", "exec ./serve.sh"]
[service.health]
http = "http://127.0.0.1:3000/"
`))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if cfg.Workspace != d.Workspace || cfg.HealthAddr != d.HealthAddr || len(cfg.Watch) != 1 || cfg.Watch[0] != "src" {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if cfg.Debounce.Duration != 500*time.Millisecond || cfg.GoodAfter.Duration != 30*time.Second ||
		cfg.CrashWindow.Duration != time.Minute || cfg.CrashThreshold != 3 || cfg.MaxFailedReverts != 3 {
		t.Errorf("timing defaults: %+v", cfg)
	}
	if cfg.Agent.Name != "agent" || cfg.Supervisor.Email != "supervisor@localhost" {
		t.Errorf("identity defaults: %+v %+v", cfg.Agent, cfg.Supervisor)
	}
	s := cfg.Services[0]
	if s.Dir != "." || !s.IsRevertable() || s.Health.Interval.Duration != defaultHealthInterval || s.Health.Timeout.Duration != defaultHealthTimeout {
		t.Errorf("service defaults: %+v %+v", s, s.Health)
	}
}

func TestConfigRelativeWorkspace(t *testing.T) {
	cfg, err := ParseConfig("/srv/app/sup.toml", []byte(`workspace = "ws"`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workspace != "/srv/app/ws" {
		t.Errorf("workspace = %q, want /srv/app/ws", cfg.Workspace)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	svc := "\n[[service]]\nname = \"web\"\ncommand = [\"true\"]\n"
	for _, tc := range []struct {
		name, toml, key string
	}{
		{"bad duration", `debounce = "soon"`, "debounce"},
		{"wrong type", `crash_threshold = "three"`, "crash_threshold"},
		{"zero duration", `good_after = "0s"`, "good_after"},
		{"threshold", `crash_threshold = 0`, "crash_threshold"},
		{"negative reverts", `max_failed_reverts = -1`, "max_failed_reverts"},
		{"unknown key", `wacth = ["src"]`, "wacth"},
		{"unknown service key", svc + `comand = ["x"]`, "service.comand"},
		{"watch escapes", `watch = ["../etc"]`, "watch[0]"},
		{"watch root", `watch = ["."]`, "watch[0]"},
		{"watch infra", `watch = ["src", "infra/x"]`, "watch[1]"},
		{"watch git", `watch = [".git"]`, "watch[0]"},
		{"health addr", `health_addr = "nope"`, "health_addr"},
		{"notify url scheme", `notify_url = "ftp://hooks.example/x"`, "notify_url"},
		{"notify url host", `notify_url = "https:///x"`, "notify_url"},
		{"agent email", "[agent]\nemail = \"a\\nb\"", "agent.email"},
		{"backoff order", `restart_backoff = "10s"` + "\n" + `max_backoff = "1s"`, "max_backoff"},
		{"service name", "[[service]]\nname = \"Web Site\"\ncommand = [\"true\"]", "service[0].name"},
		{"duplicate service", svc + svc, "service[1].name"},
		{"no command", "[[service]]\nname = \"web\"", "service[0].command"},
		{"service dir", svc + `dir = "/abs"`, "service[0].dir"},
		{"env", svc + `env = ["NOVALUE"]`, "service[0].env[0]"},
		{"two checks", svc + "[service.health]\nhttp = \"http://x/\"\ntcp = \"x:1\"", "service[0].health"},
		{"bad url", svc + "[service.health]\nhttp = \"ftp://x/\"", "service[0].health.http"},
		{"bad tcp", svc + "[service.health]\ntcp = \"x\"", "service[0].health.tcp"},
		{"git dir in workspace", "workspace = \"/w\"\ngit_dir = \"/w/.sup\"", "git_dir"},
		{"git dir is workspace", "workspace = \"/w\"\ngit_dir = \"/w\"", "git_dir"},
		{"health socket in workspace", "workspace = \"/w\"\nhealth_socket = \"/w/h.sock\"", "health_socket"},
		{"health socket in git dir", "git_dir = \"/g\"\nhealth_socket = \"/g/h.sock\"", "health_socket"},
		{"health socket too long", "health_socket = \"/" + strings.Repeat("s", 120) + "\"", "health_socket"},
		{"git dir holds workspace", "workspace = \"/srv/w\"\ngit_dir = \"/srv\"", "git_dir"},
		{"git dir root", `git_dir = "/"`, "git_dir"},
		{"ignore slash", `ignore = ["a/b"]`, "ignore[0]"},
		{"ignore everything", `ignore = ["node_modules", "*"]`, "ignore[1]"},
		{"ignore dotdot", `ignore = [".."]`, "ignore[0]"},
		{"user name", `app_user = "Root User"`, "app_user"},
		{"users differ", `services_user = "app"`, "services_user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("sup.toml", []byte(tc.toml))
			if err == nil {
				t.Fatal("accepted")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("not a ConfigError: %v", err)
			}
			if ce.Key != tc.key || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q names key %q, want %q", err, ce.Key, tc.key)
			}
		})
	}
}
