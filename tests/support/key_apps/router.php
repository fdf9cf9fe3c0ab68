<?php
// What a PHP app reads (php -S): `$_REQUEST` (query, body and, with no
// php.ini, cookies, merged), and headers as `$_SERVER` folds their names.
header('Content-Type: application/json');
echo json_encode([
    'request' => $_REQUEST['id'] ?? null,
    'header' => $_SERVER['HTTP_X_DEVICE_ID'] ?? null,
    'role' => $_SERVER['HTTP_X_ROLEGATE_ROLE'] ?? null,
    'token' => $_SERVER['HTTP_X_ROLEGATE_TOKEN'] ?? null,
    'hop' => $_SERVER['HTTP_X_ROLEGATE_HOP'] ?? null,
]);
