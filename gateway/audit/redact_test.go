package audit

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRedactText(t *testing.T) {
	r := newRedactor()
	tests := []struct {
		in, want string
	}{
		{"uptime", "uptime"},
		{"ls -la /etc && cat /var/log/syslog", "ls -la /etc && cat /var/log/syslog"},
		{"export GITHUB_TOKEN=abc123 && make", "export GITHUB_TOKEN=[redacted] && make"},
		{"export API_TOKEN=abc;run", "export API_TOKEN=[redacted];run"},
		{"DB_PASSWORD='s3cr et' ./run", "DB_PASSWORD=[redacted] ./run"},
		{`curl -H "Authorization: Bearer eyJabc.def.ghi" https://x`, `curl -H "Authorization: Bearer [redacted]" https://x`},
		{"curl -u admin:hunter2 https://admin:hunter2@example.com/x", "curl -u admin:[redacted] https://admin:[redacted]@example.com/x"},
		{"mysql --password hunter2 db", "mysql --password [redacted] db"},
		{"tool --api-key=k-123 run", "tool --api-key=[redacted] run"},
		{"echo ghp_abcdefghijklmnopqrstuvwxyz0123", "echo [redacted]"},
		{"aws s3 ls # AKIAABCDEFGHIJKLMNOP", "aws s3 ls # [redacted]"},
		{"cat <<EOF\n-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\nEOF", "cat <<EOF\n[redacted private key]\nEOF"},
		{"use " + apiTokenPrefix + "abcdefghijklmnopqrstuvwxyz", "use [redacted]"},
	}
	for _, tc := range tests {
		if got := r.text(tc.in); got != tc.want {
			t.Errorf("text(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
	long := strings.Repeat("é", 5000)
	if got := r.text(long); len(got) > maxSummaryText+40 || !strings.Contains(got, "more bytes]") {
		t.Errorf("a long text was kept at %d bytes", len(got))
	}
}

// TestRedactClasses: each class of secret is blanked in the shapes it
// comes in, and what is not secret around it stays readable.
func TestRedactClasses(t *testing.T) {
	r := newRedactor()
	for _, tc := range []struct{ class, in, want string }{
		// Short options with the password glued on, or after them.
		{"mysql -p", "mysql -u root -pS3cret mydb", "mysql -u root -p[redacted] mydb"},
		{"mysql -p", "mysqldump -h db -u app -p'a b c' shop > dump.sql", "mysqldump -h db -u app -p[redacted] shop > dump.sql"},
		{"mysql -p", `mariadb -p"x y" -e 'select 1'`, `mariadb -p[redacted] -e 'select 1'`},
		{"mysql -p", "mysqladmin -uroot -pS3cret status", "mysqladmin -uroot -p[redacted] status"},
		{"sshpass -p", "sshpass -p S3cret ssh admin@host uptime", "sshpass -p [redacted] ssh admin@host uptime"},
		{"sshpass -p", "sshpass -pS3cret scp f host:", "sshpass -p[redacted] scp f host:"},
		{"redis-cli -a", "redis-cli -h cache -a S3cret ping", "redis-cli -h cache -a [redacted] ping"},
		{"ldapsearch -w", "ldapsearch -x -D cn=admin -w S3cret -b dc=x", "ldapsearch -x -D cn=admin -w [redacted] -b dc=x"},
		{"mongosh -p", "mongosh -u admin -p S3cret --eval 'db.stats()'", "mongosh -u admin -p [redacted] --eval 'db.stats()'"},
		{"smbclient -U", "smbclient //srv/share -U alice%S3cret", "smbclient //srv/share -U alice%[redacted]"},
		{"openssl pass:", "openssl enc -aes256 -pass pass:S3cret -in f", "openssl enc -aes256 -pass pass:[redacted] -in f"},
		{"login -p", "docker login -u bob -p S3cret registry.example.com", "docker login -u bob -p [redacted] registry.example.com"},
		{"login -p", "docker login -u bob -pS3cretPassw0rd registry.example.com", "docker login -u bob -p[redacted] registry.example.com"},
		{"login -p", "podman login --tls-verify=false -u bob -p 'S3cret x' quay.io", "podman login --tls-verify=false -u bob -p [redacted] quay.io"},
		{"login -p", "helm registry login r.io -u bob -p S3cret", "helm registry login r.io -u bob -p [redacted]"},
		{"login -p", "az login --service-principal -u app -p S3cret --tenant t", "az login --service-principal -u app -p [redacted] --tenant t"},
		{"sqlcmd -P", "sqlcmd -S db -U sa -P S3cret -Q 'select 1'", "sqlcmd -S db -U sa -P [redacted] -Q 'select 1'"},
		{"archive", "zip -P S3cret out.zip f", "zip -P [redacted] out.zip f"},
		{"archive", "unzip -P S3cret in.zip", "unzip -P [redacted] in.zip"},
		{"archive", "7z a -pS3cret out.7z f", "7z a -p[redacted] out.7z f"},
		{"ssh-keygen -N", "ssh-keygen -t ed25519 -N 'S3cret' -f k", "ssh-keygen -t ed25519 -N [redacted] -f k"},
		{"ssh-keygen -N", "ssh-keygen -p -P S3cret -N S3cret2 -f k", "ssh-keygen -p -P [redacted] -N [redacted] -f k"},
		{"htpasswd -b", "htpasswd -b .htpasswd bob S3cret", "htpasswd -b .htpasswd bob [redacted]"},
		{"htpasswd -b", "htpasswd -cbB /etc/nginx/htpasswd bob S3cret", "htpasswd -cbB /etc/nginx/htpasswd bob [redacted]"},
		{"htpasswd -b", "htpasswd -nb bob S3cret", "htpasswd -nb bob [redacted]"},
		{"gh secret set", "gh secret set API_KEY --body S3cret", "gh secret set API_KEY --body [redacted]"},
		{"gh secret set", "gh secret set X -b S3cret -R o/r", "gh secret set X -b [redacted] -R o/r"},
		{"creds", "skopeo copy --src-creds bob:S3cret docker://a docker://b", "skopeo copy --src-creds [redacted] docker://a docker://b"},
		{"creds", "podman pull --creds=bob:S3cret quay.io/x", "podman pull --creds=[redacted] quay.io/x"},
		// Long options, = and separate word forms.
		{"option", "psql --password=S3cret -h db", "psql --password=[redacted] -h db"},
		{"option", "tool --passwd S3cret run", "tool --passwd [redacted] run"},
		{"option", "vault login --token=hvs.S3cret", "vault login --token=[redacted]"},
		{"option", "gh auth login --with-token --token S3cret", "gh auth login --with-token --token [redacted]"},
		{"option", "app --client-secret 'a b' --secret=x", "app --client-secret [redacted] --secret=[redacted]"},
		{"option", "tool --api-key k-1 --apikey k-2 --access-key k-3", "tool --api-key [redacted] --apikey [redacted] --access-key [redacted]"},
		{"option", "keytool -storepass S3cret -keypass S3cret2", "keytool -storepass [redacted] -keypass [redacted]"},
		{"option", "curl --cookie 'sid=S3cret' https://x", "curl --cookie [redacted] https://x"},
		{"option", "wget --http-password=S3cret https://x", "wget --http-password=[redacted] https://x"},
		// HTTP headers, in any quoting.
		{"header", "curl -H 'Authorization: Bearer S3cret.tok' https://api", "curl -H 'Authorization: Bearer [redacted]' https://api"},
		{"header", `curl -H "Authorization: Basic dXNlcjpwYXNz" https://api`, `curl -H "Authorization: Basic [redacted]" https://api`},
		{"header", "curl -H Authorization:token\\ S3cret https://api", "curl -H Authorization:token\\ [redacted] https://api"},
		{"header", `curl --header="authorization: S3cret" https://api`, `curl --header="authorization: [redacted]" https://api`},
		{"header", "curl -H 'X-Api-Key: S3cret' https://api", "curl -H 'X-Api-Key: [redacted]' https://api"},
		{"header", "curl -H 'PRIVATE-TOKEN: S3cret' https://gitlab", "curl -H 'PRIVATE-TOKEN: [redacted]' https://gitlab"},
		{"header", `curl -H "Cookie: sid=S3cret; theme=dark" https://x`, `curl -H "Cookie: [redacted]" https://x`},
		{"header", `http GET api X-Auth-Token:S3cret`, `http GET api X-Auth-Token:[redacted]`},
		// Variables named like secrets.
		{"env", "PGPASSWORD=S3cret psql -h db", "PGPASSWORD=[redacted] psql -h db"},
		{"env", "MYSQL_PWD=S3cret mysql", "MYSQL_PWD=[redacted] mysql"},
		{"env", "env AWS_SECRET_ACCESS_KEY=S3cret aws s3 ls", "env AWS_SECRET_ACCESS_KEY=[redacted] aws s3 ls"},
		{"env", `export SLACK_BOT_TOKEN="xoxb S3cret"; run`, "export SLACK_BOT_TOKEN=[redacted]; run"},
		{"env", "declare -x DB_PASSWD=S3cret", "declare -x DB_PASSWD=[redacted]"},
		{"env", "PRIVATE_KEY=S3cret API_KEY=S3cret2 ./app", "PRIVATE_KEY=[redacted] API_KEY=[redacted] ./app"},
		{"env", `docker run -e "DB_PASSWORD=S3cret" app`, `docker run -e "DB_PASSWORD=[redacted]" app`},
		{"env", "curl 'https://x/login?user=bob&password=S3cret&next=/'", "curl 'https://x/login?user=bob&password=[redacted]&next=/'"},
		// URLs with credentials keep the user.
		{"url", "git clone https://bob:S3cret@git.example.com/r.git", "git clone https://bob:[redacted]@git.example.com/r.git"},
		{"url", "psql postgres://app:S3cret@db:5432/shop", "psql postgres://app:[redacted]@db:5432/shop"},
		{"url", "redis-cli -u redis://:S3cret@cache:6379", "redis-cli -u redis://:[redacted]@cache:6379"},
		{"url", "curl -u bob:S3cret https://x", "curl -u bob:[redacted] https://x"},
		{"url", "curl --user 'bob:S3cret' https://x", "curl --user 'bob:[redacted]' https://x"},
		{"url", "curl -u :S3cret https://x", "curl -u :[redacted] https://x"},
		{"url", "az storage blob download --blob-url 'https://a.blob.core.windows.net/c/f?sv=2020-08-04&sig=S3cret%2Bx%3D&se=x'",
			"az storage blob download --blob-url 'https://a.blob.core.windows.net/c/f?sv=2020-08-04&sig=[redacted]&se=x'"},
		{"url", "curl 'https://b.s3.amazonaws.com/k?X-Amz-Credential=AK&X-Amz-Signature=S3cretabc'", "curl 'https://b.s3.amazonaws.com/k?X-Amz-Credential=[redacted]&X-Amz-Signature=[redacted]'"},
		// AWS keys.
		{"aws", "aws configure set aws_access_key_id ASIAABCDEFGHIJKLMNOP", "aws configure set aws_access_key_id [redacted]"},
		{"aws", "aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws configure set aws_secret_access_key [redacted]"},
		{"aws", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE aws sts get-caller-identity", "AWS_ACCESS_KEY_ID=[redacted] aws sts get-caller-identity"},
		// Well-known token shapes.
		{"token", "git push https://x-access-token:gho_abcdefghijklmnopqrstuvwxyz012345@github.com/o/r", "git push https://x-access-token:[redacted]@github.com/o/r"},
		{"token", "echo github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "echo [redacted]"},
		{"token", "notify xoxb-1234567890-abcdefghij", "notify [redacted]"},
		{"token", "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc_DEF-ghi", "jwt [redacted]"},
		{"token", "maps AIzaSyA1234567890abcdefghijklmnopqrstuv", "maps [redacted]"},
		{"token", "charge sk_live_4eC39HqLyjWDarjtT1zdp7dc", "charge [redacted]"},
		{"token", "push glpat-abcdefghij0123456789", "push [redacted]"},
		{"token", "vault login hvs.CAESIJlWh3Q7XyzS3cret0123456789", "vault login [redacted]"},
		{"token", "curl -X POST https://hooks.slack.com/services/T000/B000/S3cretXXXX -d x", "curl -X POST https://[redacted] -d x"},
		{"token", "curl https://discord.com/api/webhooks/123456/S3cret-abc", "curl https://[redacted]"},
		// A short option with a value glued on is not taken for an
		// option named like a secret: the word after it stays.
		{"glued", "tool -xPass1 next", "tool -xPass1 next"},
		// Config files written by a command.
		{"json", `curl -d '{"user":"bob","password":"S3c\"ret"}' https://x`, `curl -d '{"user":"bob","password":"[redacted]"}' https://x`},
		{"yaml", "cat > app.yaml <<EOF\ndb:\n  host: db\n  password: S3cret\nEOF", "cat > app.yaml <<EOF\ndb:\n  host: db\n  password: [redacted]\nEOF"},
		{"netrc", "echo 'machine api.x login bob password S3cret' >> ~/.netrc", "echo 'machine api.x login bob password [redacted]' >> ~/.netrc"},
		{"private key", "echo '-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----' > k", "echo '[redacted private key]' > k"},
		{"private key", "gpg --import <<EOF\n-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQ\n-----END PGP PRIVATE KEY BLOCK-----\nEOF", "gpg --import <<EOF\n[redacted private key]\nEOF"},
		{"private key", "cat > k.pem <<'EOF'\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE S3cret\n-----END EC PRIVATE KEY-----\nEOF", "cat > k.pem <<'EOF'\n[redacted private key]\nEOF"},
		{"private key", "printf '%s' '-----BEGIN RSA PRIVATE KEY-----\nS3cret' | openssl rsa", "printf '%s' '[redacted private key]"},
		{"private key", "cat > u.creds <<EOF\n-----BEGIN USER NKEY SEED-----\nSUAS3cret\n------END USER NKEY SEED------\nEOF", "cat > u.creds <<EOF\n[redacted private key]\nEOF"},
		// Variables and options whose names end in KEY.
		{"key", "ENCRYPTION_KEY=S3cret ./app", "ENCRYPTION_KEY=[redacted] ./app"},
		{"key", "export SIGNING_KEY='S3cret x'", "export SIGNING_KEY=[redacted]"},
		{"key", "APP_KEY=base64:S3cret php artisan serve", "APP_KEY=[redacted] php artisan serve"},
		{"key", "env MASTER_KEY=S3cret KMS_KEY=S3cret2 run", "env MASTER_KEY=[redacted] KMS_KEY=[redacted] run"},
		{"key", "docker run -e SECRET_KEY_BASE=S3cret -e STRIPE_KEY=S3cret2 app", "docker run -e SECRET_KEY_BASE=[redacted] -e STRIPE_KEY=[redacted] app"},
		{"key", "KEY=S3cret make deploy", "KEY=[redacted] make deploy"},
		{"key", "tool --signing-key S3cret --encryption-key=S3cret2", "tool --signing-key [redacted] --encryption-key=[redacted]"},
		{"key", "restic --license-key S3cret", "restic --license-key [redacted]"},
		// openssl enc -k PASSWORD, and -pass pass:X.
		{"openssl -k", "openssl enc -aes-256-cbc -k S3cret -in f -out g", "openssl enc -aes-256-cbc -k [redacted] -in f -out g"},
		{"openssl -k", "openssl enc -d -aes256 -in g -k 'S3cret x'", "openssl enc -d -aes256 -in g -k [redacted]"},
		{"openssl -k", "openssl pkcs12 -export -passout pass:S3cret -in c", "openssl pkcs12 -export -passout pass:[redacted] -in c"},
		// HTTP clients, FTP, database tools taking user and password.
		{"httpie", "http -a bob:S3cret GET https://api", "http -a bob:[redacted] GET https://api"},
		{"httpie", "https --auth=bob:S3cret api.example.com", "https --auth=bob:[redacted] api.example.com"},
		{"httpie", "xh -a 'bob:S3cret' get api", "xh -a 'bob:[redacted]' get api"},
		{"lftp", "lftp -u bob,S3cret sftp://h", "lftp -u bob,[redacted] sftp://h"},
		{"lftp", "lftp -e 'open -u bob,S3cret h; mirror' ", "lftp -e 'open -u bob,[redacted] h; mirror' "},
		{"oracle", "sqlplus scott/S3cret@db @q.sql", "sqlplus scott/[redacted]@db @q.sql"},
		{"oracle", "sqlplus -S -L scott/S3cret", "sqlplus -S -L scott/[redacted]"},
		{"oracle", "expdp system/S3cret@pdb directory=d dumpfile=x.dmp", "expdp system/[redacted]@pdb directory=d dumpfile=x.dmp"},
		{"oracle", "rman target sys/S3cret@db", "rman target sys/[redacted]@db"},
		{"oracle", "exp userid=scott/S3cret file=x.dmp", "exp userid=scott/[redacted] file=x.dmp"},
		// Query parameters named like secrets.
		{"url query", "curl 'https://maps.example.com/api?key=S3cret&q=x'", "curl 'https://maps.example.com/api?key=[redacted]&q=x'"},
		{"url query", "curl https://x/feed?token=S3cret", "curl https://x/feed?token=[redacted]"},
		{"url query", "wget 'https://x/dl?id=1&password=S3cret'", "wget 'https://x/dl?id=1&password=[redacted]'"},
		{"url query", "curl 'https://x/a?api_key=S3cret&apikey=S3cret2&auth=S3cret3'", "curl 'https://x/a?api_key=[redacted]&apikey=[redacted]&auth=[redacted]'"},
		{"url query", "open 'https://x/cb?session=S3cret'", "open 'https://x/cb?session=[redacted]'"},
		// Token shapes: Vault's, NATS seeds, this fleet's own.
		{"vault", "VAULT_TOKEN=s.Ab3cDeF4gHiJkL5mNoPqRs6t vault read x", "VAULT_TOKEN=[redacted] vault read x"},
		{"vault", "vault login s.Ab3cDeF4gHiJkL5mNoPqRs6t", "vault login [redacted]"},
		{"vault", "vault token lookup b.AAAAAQJ2xS3cretVeRy9lOnG", "vault token lookup [redacted]"},
		{"vault", "vault login hvb.AAAAAQS3cret0123456789abcdef", "vault login [redacted]"},
		{"nkey", "nsc add user -k SUAKYHKMIF4YAH6SXWRJG2KAMHDRJ6KR2AURLC3RB6EWEFD7T4QPVIOS3C", "nsc add user -k [redacted]"},
		{"nkey", "echo SAAL7VOEKXH2T6RAUXEMQBHBZUDN4YUGJ5FBLYH3FLGFLDFDPCTQ3CQ3BE > acc.nk", "echo [redacted] > acc.nk"},
		{"nkey", "nats --nkey=SOALU7LPGJK2BDF4IHD7UZT6ZM7QBJS3ZAXG7SJDQM53LK34TN3LQF2T5Y sub x", "nats --nkey=[redacted] sub x"},
		{"join token", "fleet-agent join fmcp1.abcdefghij.S3cretW8PKz1m2nQ3oR4sT5uV6wX7yZ8aB9cD0eF1gH", "fleet-agent join fmcp1.abcdefghij.[redacted]"},
		{"join token", "fleet-agent join fmcpn1.eyJTMcretLongBase64urlPayload0123456789 --name x", "fleet-agent join fmcpn1.[redacted] --name x"},
		{"jwt", "curl -H 'x-jwt: eyJhbGciOiJSUzI1NiJ9.eyJTM2NyZXQiOjF9.c2lnbmF0dXJl' u", "curl -H 'x-jwt: [redacted]' u"},
	} {
		got := r.text(tc.in)
		if got != tc.want {
			t.Errorf("%s: text(%q)\n got %q\nwant %q", tc.class, tc.in, got, tc.want)
		}
		if strings.Contains(got, "S3cret") {
			t.Errorf("%s: %q kept the secret", tc.class, got)
		}
	}
}

// TestRedactKeepsLookAlikes: what only looks like a secret stays.
func TestRedactKeepsLookAlikes(t *testing.T) {
	r := newRedactor()
	for _, in := range []string{
		"mysql -u root -p mydb",                  // -p alone prompts; mydb is the database
		"sort -u file; git add -u; ps -u root",   // -u without user:password
		"docker run -u 1000:1000 -p 8080:80 app", // uid:gid, ports
		"sudo -u postgres psql -c 'select 1'",
		"git commit --author 'Ann <a@x>' -m fix", // author is not auth
		"llm --max-tokens 500 --tokenizer bpe",
		"docker login --password-stdin -u bob registry",
		"vault login --token-file /run/tok; tool --password-file=/etc/pw",
		"echo $PWD; OLDPWD=/tmp cd -",
		"git log 9fceb02d0ae598e95dc970b74767f19372d61af8", // 40 hex: a commit
		"sha1sum f # 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12",
		"ssh -p 2222 host; scp -P 2222 f host:",
		"pg_dump --no-password shop > shop.sql",
		"curl https://example.com/path:with:colons",
		"echo passive bypass compass",
		"kubectl get secret db-creds -o yaml",
		"export TOKEN_URL=https://auth.example.com/token",
		"find . -name '*.pem' -newer key.pem",
		`curl -d '{"token_type":"bearer","password_length":12}' https://x`,
		"docker run -p 8080:80 -e MODE=login app", // a port, not a password
		"htpasswd -D .htpasswd bob",
		"zip -r out.zip dir; unzip -p in.zip f",
		"ssh-keygen -t ed25519 -f k -C bob@host",
		"gh secret list; gh secret set X < value.txt",
		"kubectl get secret db-creds -o yaml --show-managed-fields",
		// Keys that are not secrets, and key options that name files.
		"PRIMARY_KEY=id SORT_KEY=created_at ./migrate",
		"export PARTITION_KEY=region CACHE_KEY=v2 PUBLIC_KEY=ssh-ed25519",
		"SSH_KEY_PATH=~/.ssh/id_ed25519 GPG_KEY_ID=ABCD1234 ./release",
		"sort --key 2,3 f; sort -k2 f; openssl rsa -in k -pubout",
		"curl --key client.key --cert c.pem https://x; openssl req -key ./k -new",
		"gcloud auth activate-service-account --key-file=sa.json",
		"ssh-add --apple-use-keychain ~/.ssh/key; tool --ssh-key ~/.ssh/x",
		"openssl enc -d -kfile pass.txt -in g; openssl enc -pass env:PW -in f",
		"sqlplus /nolog; sqlplus / as sysdba; sqlplus @script.sql",
		"lftp sftp://h -e 'mirror; bye'; sort -u a,b",
		"http GET https://api Accept:application/json; ls -a x:y",
		"curl 'https://x/s?q=monkey&sort=asc&hotkey=1&page=2'",
		"dig s.example.com; host b.cdn.example.org",
		"echo SUNDAY SATURDAY; git log fmcp1-release",
	} {
		if got := r.text(in); got != in {
			t.Errorf("text(%q) = %q, want it unchanged", in, got)
		}
	}
	// Not everything with an AWS look: 40 base64 characters outside an
	// AWS context stay.
	in := "echo wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	if got := r.text(in); got != in {
		t.Errorf("text(%q) = %q", in, got)
	}
}

// FuzzRedact: redaction never panics, stays bounded, is idempotent, and
// a secret planted in each class's shape is blanked whatever surrounds
// it.
func FuzzRedact(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"echo", "| grep x"}, {"'", `"`}, {"cd /tmp &&", "; ls"}, {"a=b", "\n"}, {"-----BEGIN", "@"}} {
		f.Add(s[0], s[1])
	}
	r := newRedactor()
	const secret = "Zq7Secr3tValue9"
	shapes := []string{
		"mysql -u root -p" + secret + " db", "sshpass -p " + secret + " ssh h", "psql --password=" + secret, "tool --token " + secret,
		"curl -H 'Authorization: Bearer " + secret + "' u", `curl -H "X-Api-Key: ` + secret + `" u`, "PGPASSWORD=" + secret + " psql",
		"export API_TOKEN=" + secret, "git clone https://bob:" + secret + "@h/r", "curl -u bob:" + secret + " u",
		"docker login -u bob -p " + secret + " r", "sqlcmd -U sa -P " + secret, "zip -P " + secret + " o.zip f", "htpasswd -b f bob " + secret,
		"skopeo copy --creds bob:" + secret + " a b",
		"ENCRYPTION_KEY=" + secret + " ./app", "tool --signing-key " + secret, "openssl enc -k " + secret + " -in f",
		"http -a bob:" + secret + " u", "lftp -u bob," + secret + " h", "sqlplus scott/" + secret + "@db",
		"curl 'https://x/a?key=" + secret + "&q=1'",
	}
	f.Fuzz(func(t *testing.T, pre, post string) {
		if len(pre) > 300 || len(post) > 300 {
			return
		}
		for _, shape := range shapes {
			in := pre + "\n" + shape + "\n" + post
			got := r.text(in)
			if strings.Contains(got, secret) && !strings.Contains(pre+post, secret) {
				t.Fatalf("%q kept the secret: %q", in, got)
			}
			if len(got) > maxSummaryText+40 {
				t.Fatalf("%q: %d bytes", in, len(got))
			}
			if again := r.text(got); again != got {
				t.Fatalf("not idempotent: %q became %q, then %q", in, got, again)
			}
		}
	})
}

func TestRedactArgs(t *testing.T) {
	r := newRedactor()
	raw := json.RawMessage(`{"host":"web-1","path":"/etc/app.conf","content":"password=x\nline2","offset":3,
		"edits":[{"old_string":"a","new_string":"b"}],"api_key":"k","opts":{"x":1},"tags":["a","b"],"token":"t"}`)
	got := r.args(raw)
	want := map[string]any{
		"host": "web-1", "path": "/etc/app.conf", "content_bytes": 16, "offset": 3.0,
		"edits_bytes": 37, "api_key": "[redacted]", "opts": "[object, 7 bytes]", "tags": "[2 items, 9 bytes]", "token": "[redacted]",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("args[%q] = %#v, want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("args = %v, want exactly the keys of %v", got, want)
	}
	if got := r.args(json.RawMessage(`[1,2]`)); got["unreadable_bytes"] != 5 {
		t.Errorf("non-object arguments = %v", got)
	}
	if got := r.args(nil); got != nil {
		t.Errorf("no arguments = %v, want nil", got)
	}
}

// BenchmarkRedactText measures the redaction of a typical command and of
// a long one.
func BenchmarkRedactText(b *testing.B) {
	r := newRedactor()
	for _, bc := range []struct{ name, text string }{
		{"short", "curl -H 'Authorization: Bearer abc' -u bob:pw https://api.example.com/v1/items | jq ."},
		{"long", strings.Repeat("make build && ls -la bin/ && git diff --stat HEAD~1 | head -20; ", 40)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				r.text(bc.text)
			}
		})
	}
}
